"""The documentation site builds with ``mkdocs build --strict``: a broken link, a missing page,
a page left out of the navigation or a failing CLI-reference hook fails the suite."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_site_builds_strict(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    cli = (tmp_path / "site" / "cli" / "index.html").read_text()
    # The hook wrote the reference from the parsers: every command has its section.
    from lenserve.cli import COMMANDS
    for name in COMMANDS:
        assert f"lenserve {name}" in cli, name
    assert "<!-- cli-reference -->" not in cli and "&lt;!-- cli-reference" not in cli


def test_every_page_in_docs_is_in_the_nav():
    import yaml

    class _Loader(yaml.SafeLoader):
        pass
    # mkdocs.yml may carry !!python tags (Material's emoji extension); none are needed here.
    nav = yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=_Loader)["nav"]

    def pages(items):
        for item in items:
            value = next(iter(item.values())) if isinstance(item, dict) else item
            if isinstance(value, list):
                yield from pages(value)
            else:
                yield value
    listed = set(pages(nav))
    # docs/results/*.md are the benchmarks' table outputs, excluded from the build.
    on_disk = {str(p.relative_to(ROOT / "docs")) for p in (ROOT / "docs").rglob("*.md")
               if p.parent.name != "results"}
    assert on_disk - listed == set(), "pages not in mkdocs.yml's nav"
    assert listed - on_disk == set(), "nav entries without a page"
