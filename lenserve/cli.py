"""The ``lenserve`` command. Each subcommand lives in ``lenserve/commands/<name>.py`` and exposes
``register(subparsers)``, which adds its parser and sets ``func`` to a callable taking the
parsed args and returning an exit code."""
from __future__ import annotations

import argparse
import importlib
import sys

COMMAND_MODULES = [
    "lenserve.commands.generate",
    "lenserve.commands.bench",
    "lenserve.commands.bench_executor",
    "lenserve.commands.bench_attention",
    "lenserve.commands.bench_scheduler",
    "lenserve.commands.predictor",
    "lenserve.commands.profile",
    "lenserve.commands.simulate",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lenserve", description="LLM serving with length-aware scheduling")
    subparsers = parser.add_subparsers(dest="command", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130
    except (ValueError, FileNotFoundError) as exc:
        # Bad input reaches the user as one clear line, not a traceback.
        print(f"lenserve {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
