"""MkDocs hook: the CLI reference page (``docs/cli.md``) is written at build time from the
``lenserve`` command's own argparse parsers, so it cannot drift from the code.

The page keeps its hand-written introduction; the marker ``<!-- cli-reference -->`` is replaced
by one section per command (and per sub-command, e.g. ``lenserve predictor serve``)."""
from __future__ import annotations

import argparse

MARKER = "<!-- cli-reference -->"


def on_page_markdown(markdown: str, page, config, files) -> str:
    if MARKER not in markdown:
        return markdown
    return markdown.replace(MARKER, cli_reference())


def cli_reference() -> str:
    from lenserve.cli import build_parser

    parser = build_parser()
    return "\n".join(_sections(parser, "lenserve", level=2))


def _sections(parser: argparse.ArgumentParser, name: str, level: int):
    for sub_name, sub in _subcommands(parser):
        full = f"{name} {sub_name}"
        yield f"{'#' * level} `{full}`\n"
        if sub.description or _help_of(parser, sub_name):
            yield _escape(sub.description or _help_of(parser, sub_name)) + "\n"
        yield "```text\n" + sub.format_usage().strip() + "\n```\n"
        rows = list(_option_rows(sub))
        if rows:
            yield "| option | default | what it does |\n| --- | --- | --- |"
            yield from rows
            yield ""
        yield from _sections(sub, full, min(level + 1, 4))


def _subcommands(parser: argparse.ArgumentParser):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            yield from action.choices.items()


def _help_of(parser: argparse.ArgumentParser, sub_name: str) -> str:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for choice in action._choices_actions:
                if choice.dest == sub_name and choice.help:
                    return choice.help
    return ""


def _option_rows(parser: argparse.ArgumentParser):
    formatter = parser._get_formatter()
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        if action.help == argparse.SUPPRESS or action.dest == "debug":
            continue
        names = ", ".join(action.option_strings) or action.dest
        if action.choices and not isinstance(action.choices, dict):
            names += " {" + ",".join(map(str, action.choices)) + "}"
        elif action.nargs != 0 and action.option_strings:
            names += " " + formatter._format_args(action, action.dest.upper())
        help_text = formatter._expand_help(action) if action.help else ""
        yield f"| `{_flat(names)}` | {_cell(_default(action))} | {_escape(_cell(help_text))} |"


def _default(action: argparse.Action) -> str:
    if action.required:
        return "required"
    default = action.default
    if default in (None, argparse.SUPPRESS) or isinstance(action, argparse._StoreTrueAction):
        return ""
    return f"`{default}`"


def _flat(text: str) -> str:
    return " ".join(str(text).split())


def _cell(text: str) -> str:
    # Pipes inside a code span do not split a table cell; elsewhere they must be escaped.
    return _flat(text).replace("|", "\\|")


def _escape(text: str) -> str:
    # argparse help is plain text: keep markdown from reading <...> as HTML or * as emphasis.
    return text.replace("<", "&lt;").replace(">", "&gt;").replace("*", "\\*")
