"""`lenserve predictor serve|build|eval` — the length predictor service (ALISE §3.1) and its
offline eval.

`serve` and `build` come from the service (`services/predictor/__main__.py`); `eval` from
`evaluation.predictor`, imported only when `eval` is named: the service's image ships without
`evaluation/`, and its `serve` must not need it."""
from __future__ import annotations

import argparse

EVAL_HELP = ("ALISE vs baselines on a train/test split, or --shift: seeded from one model's "
             "replies, serving another")


class DeferredParser(argparse.ArgumentParser):
    """A parser whose arguments `define(parser)` adds the first time it parses or formats its
    usage or help, so that the module defining them is imported only when its command is
    named (or its help read)."""

    def __init__(self, *args, define=None, **kwargs):
        super().__init__(*args, **kwargs)
        self._define = define

    def _defined(self) -> None:
        define, self._define = self._define, None
        if define is not None:
            define(self)

    def parse_known_args(self, args=None, namespace=None):
        self._defined()
        return super().parse_known_args(args, namespace)

    def format_help(self) -> str:
        self._defined()
        return super().format_help()

    def format_usage(self) -> str:
        self._defined()
        return super().format_usage()


def define_eval(parser: argparse.ArgumentParser) -> None:
    try:
        from evaluation.predictor.eval_cli import add_eval_args, evaluate
    except ModuleNotFoundError as exc:
        if not (exc.name or "").startswith("evaluation"):
            raise  # a dependency of the eval itself: its own error says which
        parser.error("needs the evaluation package, which installs from a source checkout "
                     "(pip install -e .); the service's image leaves it out")
    add_eval_args(parser)
    parser.set_defaults(func=evaluate)


def register(subparsers) -> None:
    from services.predictor.__main__ import register_subcommands

    parser = subparsers.add_parser("predictor", help="output-length predictor service")
    actions = parser.add_subparsers(dest="action", required=True, parser_class=DeferredParser)
    register_subcommands(actions)
    actions.add_parser("eval", help=EVAL_HELP, description=EVAL_HELP, define=define_eval)
