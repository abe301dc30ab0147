"""The results page: an intro, then one section per benchmark between ``<!-- BEGIN NAME -->``
and ``<!-- END NAME -->``. A command replaces only its own section, so the page holds each
figure once, as its latest run left it."""
from __future__ import annotations

import re
from pathlib import Path

# The page's order of sections; a section is placed by it the first time it is written.
ORDER = ("policies_simulated", "econoserve_paper", "econoserve_real", "alise_paper",
         "alise_gpu", "fluidinfer", "prefix_caching", "router", "policies_cpu", "predictor_accuracy",
         "executor_cpu", "model_families", "model_families_cuda", "sampling_cost",
         "parallel_sampling")

INTRO = """# Results

Every figure and table on this page comes from one command under `benchmarks/` in the
repository, which runs lenserve's own commands (`lenserve simulate`, `lenserve bench`,
`lenserve predictor eval`, `lenserve bench-executor`) and writes `docs/results/NAME.json` (the
summaries, the exact commands and a stamp: machine, date, commit, library versions),
`NAME.png`, `NAME.md` (the tables) and its own section below. To re-make a figure, run its
command from a checkout, e.g. `python3 benchmarks/policies_simulated.py`; it replaces its
section and nothing else. `benchmarks/README.md` lists the commands and their run times. Only
current figures are kept here: a re-run replaces the old one, and git keeps history.

Normalized latency is the mean over requests of end-to-end latency divided by output tokens
(s/token, lower is better), as in the ALISE, EconoServe and FluidInfer papers. Simulated
figures are estimates of a cost model, not measurements; CPU figures are measured on the
machine the stamp names and move with it.
"""

_SECTION = re.compile(r"<!-- BEGIN (?P<name>[\w.-]+) -->\n.*?<!-- END (?P=name) -->\n?", re.DOTALL)


def markers(name: str) -> tuple[str, str]:
    return f"<!-- BEGIN {name} -->", f"<!-- END {name} -->"


def section_names(text: str) -> list[str]:
    return [m.group("name") for m in _SECTION.finditer(text)]


def replace_section(text: str, name: str, body: str) -> str:
    """``text`` with section ``name`` holding ``body``: in place if it is there, else at its
    place in ``ORDER`` (before the first later section present), else at the end."""
    begin, end = markers(name)
    if text.count(begin) > 1:
        raise ValueError(f"the results page holds section {name!r} more than once; "
                         f"remove the extra copies by hand")
    block = f"{begin}\n{body.strip()}\n{end}\n"
    found = [m for m in _SECTION.finditer(text) if m.group("name") == name]
    if found:
        m = found[0]
        return text[:m.start()] + block + text[m.end():]
    if begin in text:
        raise ValueError(f"section {name!r} of the results page has no {end!r} marker")
    return _insert(text, name, block)


def _insert(text: str, name: str, block: str) -> str:
    rank = ORDER.index(name) if name in ORDER else len(ORDER)
    for m in _SECTION.finditer(text):
        other = m.group("name")
        if (ORDER.index(other) if other in ORDER else len(ORDER)) > rank:
            return text[:m.start()] + block + "\n" + text[m.start():]
    return text.rstrip("\n") + "\n\n" + block


def update(page: Path, name: str, body: str) -> None:
    """Replace section ``name`` of the page at ``page`` (made with the intro if absent)."""
    text = page.read_text() if page.exists() else INTRO
    page.parent.mkdir(parents=True, exist_ok=True)
    page.write_text(replace_section(text, name, body))


def orphan_sections(page: Path, results_dir: Path) -> list[str]:
    """Sections of the page whose result JSON is missing: figures nobody can trace back."""
    if not page.exists():
        return []
    return [n for n in section_names(page.read_text())
            if not (results_dir / f"{n}.json").exists()]
