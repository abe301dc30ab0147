"""Where a benchmark writes, and the one call that publishes a run: the JSON (with the stamp
and the exact commands), the markdown tables, and the page section. The PNG is drawn by the
benchmark itself, at ``Outputs.file(name, "png")``, before it publishes."""
from __future__ import annotations

import argparse
import json
import math
import os
import shlex
from dataclasses import dataclass
from pathlib import Path

from benchmarks import page
from benchmarks.stamp import REPO, describe

DOCS = REPO / "docs"
# --quick runs are smoke tests: they go to the ignored results/ folder, never onto the page.
QUICK_DOCS = REPO / "results" / "benchmarks-quick"


@dataclass(frozen=True)
class Outputs:
    docs: Path      # the page is docs/results.md, the files docs/results/NAME.*
    raw: Path       # the commands' own outputs (large, not published)

    @property
    def page(self) -> Path:
        return self.docs / "results.md"

    @property
    def results(self) -> Path:
        return self.docs / "results"

    def file(self, name: str, suffix: str) -> Path:
        self.results.mkdir(parents=True, exist_ok=True)
        return self.results / f"{name}.{suffix}"


def parser(description: str, *, dataset: str | None = None,
           dataset_default: Path | None = None) -> argparse.ArgumentParser:
    """A benchmark command's parser: its module docstring as the description, the output
    flags every command takes, and ``--dataset-path`` (help ``dataset``) when it reads one."""
    ap = argparse.ArgumentParser(description=description,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    if dataset is not None:
        ap.add_argument("--dataset-path", type=Path, default=dataset_default, help=dataset)
    add_args(ap)
    return ap


def add_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true",
                        help="a few requests, to check the command end to end; writes under "
                             "results/benchmarks-quick unless --docs is given")
    parser.add_argument("--docs", type=Path, default=None,
                        help="documentation folder holding results.md and results/ "
                             "(default: docs)")
    parser.add_argument("--raw", type=Path, default=None,
                        help="folder for the commands' raw outputs and logs "
                             "(default: results/raw/NAME, not published)")


def outputs(args: argparse.Namespace, name: str) -> Outputs:
    docs = args.docs or (QUICK_DOCS if args.quick else DOCS)
    return Outputs(docs=docs, raw=args.raw or REPO / "results" / "raw" / name)


def invocation(name: str, argv: list[str]) -> str:
    return shlex.join(["python3", f"benchmarks/{name}.py", *argv])


def rel(path: Path) -> str:
    """``path`` relative to the repository where it lies inside it (commands as pasted)."""
    try:
        return str(path.resolve().relative_to(REPO))
    except ValueError:
        return str(path)


@dataclass(frozen=True)
class Section:
    title: str
    text: str                             # 2-4 sentences: what the figure shows, honestly
    tables: list[tuple[str, list[str]]]   # (heading, markdown lines)
    figure_alt: str


def publish(out: Outputs, name: str, section: Section, *, argv: list[str],
            commands: list[str], stamp: dict, data: dict) -> None:
    command = invocation(name, argv)
    record = {"name": name, "command": command, "lenserve_commands": commands,
              "stamp": stamp, **data}
    out.file(name, "json").write_text(json.dumps(_finite(record), indent=1) + "\n")
    tables = "\n\n".join(f"**{head}**\n\n" + "\n".join(lines)
                         for head, lines in section.tables)
    out.file(name, "md").write_text(tables + "\n")
    figure = os.path.relpath(out.file(name, "png"), out.page.parent)
    body = "\n\n".join([
        f"## {section.title}", section.text.strip(), f"![{section.figure_alt}]({figure})",
        tables,
        f"Made by `{command}`, which ran:",
        "```bash\n" + "\n".join(commands) + "\n```", describe(stamp)])
    page.update(out.page, name, body)
    print(f"wrote {rel(out.page)} section {name} and {rel(out.results)}/{name}.*")


def _finite(value):
    """JSON without NaN or infinity, which strict readers refuse: they become null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value
