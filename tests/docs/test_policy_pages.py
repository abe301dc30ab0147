"""The policy pages of the documentation site (``docs/policies/``) keep up with the registry:
every policy the registry knows has a section of its own (a heading naming it as
``name``) and a row in the overview's table, and every option of its config dataclass is a
row of that section's options table, with the dataclass's default. A new policy or option
without docs, or a default changed in code only, fails here."""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from services.scheduler.policies import POLICIES

PAGES = Path(__file__).resolve().parents[2] / "docs" / "policies"
HEADING = re.compile(r"^(#{1,6})\s")


def _read(name: str) -> list[str]:
    return (PAGES / name).read_text().splitlines()


def _sections(policy: str) -> list[tuple[str, list[str]]]:
    """(page, lines) of every section whose heading names ``policy``: from the heading to the
    next heading of the same or a higher level (code blocks are not headings)."""
    found = []
    for path in sorted(PAGES.glob("*.md")):
        lines, fenced = _read(path.name), False
        marks = []
        for i, line in enumerate(lines):
            fenced ^= line.startswith("```")
            match = None if fenced else HEADING.match(line)
            if match:
                marks.append((i, len(match.group(1)), line))
        for n, (start, level, line) in enumerate(marks):
            if f"`{policy}`" not in line:
                continue
            end = next((i for i, lv, _ in marks[n + 1:] if lv <= level), len(lines))
            found.append((path.name, lines[start:end]))
    return found


def _documented_default(value) -> str:
    """A default as the pages write it: what ``--policy-config key=VALUE`` takes."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _option_rows(lines: list[str]) -> dict[str, list[str]]:
    """Table rows whose first cell is a backticked key: key -> the row's cells."""
    rows = {}
    for line in lines:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.lstrip().startswith("|") and re.fullmatch(r"`\w+`", cells[0]):
            rows.setdefault(cells[0].strip("`"), cells)
    return rows


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_every_policy_has_one_section(policy):
    sections = _sections(policy)
    assert len(sections) == 1, (
        f"policy {policy!r}: {len(sections)} sections in docs/policies/ name it in their "
        "heading; give it exactly one")


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_every_policy_is_in_the_overview_table(policy):
    rows = [line for line in _read("index.md") if line.startswith("|")]
    assert any(f"`{policy}`" in row.split("|")[1] for row in rows), (
        f"policy {policy!r} has no row in the table of docs/policies/index.md")


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_every_option_is_documented_with_its_default(policy):
    sections = _sections(policy)
    if len(sections) != 1:
        pytest.skip("test_every_policy_has_one_section reports it")
    page, lines = sections[0]
    rows = _option_rows(lines)
    for field in dataclasses.fields(POLICIES[policy].config_class):
        assert field.name in rows, (
            f"policy {policy!r}: option {field.name!r} has no row in its options table "
            f"(docs/policies/{page})")
        default = _documented_default(field.default)
        assert rows[field.name][1] == f"`{default}`", (
            f"policy {policy!r}: option {field.name!r} is documented with default "
            f"{rows[field.name][1]} in docs/policies/{page}; the code says `{default}`")


def test_option_tables_name_no_option_the_policy_lacks():
    """A row for a key the config does not have documents an option that is refused."""
    for policy in POLICIES:
        for page, lines in _sections(policy):
            known = {f.name for f in dataclasses.fields(POLICIES[policy].config_class)}
            extra = set(_option_rows(lines)) - known
            assert not extra, f"docs/policies/{page}, {policy!r}: rows for unknown keys {extra}"
