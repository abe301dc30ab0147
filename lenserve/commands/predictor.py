"""`lenserve predictor serve|build|eval` — the length predictor service (ALISE §3.1)."""
from __future__ import annotations


def register(subparsers) -> None:
    from services.predictor.__main__ import register_subcommands

    parser = subparsers.add_parser("predictor", help="output-length predictor service")
    register_subcommands(parser.add_subparsers(dest="action", required=True))
