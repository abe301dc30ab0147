"""The ``lenserve`` command. Each subcommand lives in ``lenserve/commands/<name>.py`` and exposes
``register(subparsers)``, which adds its parser and sets ``func`` to a callable taking the
parsed args and returning an exit code."""
from __future__ import annotations

import argparse
import contextlib
import importlib
import logging
import os
import sys

DEBUG_HELP = "show tracebacks and debug logs instead of one-line errors"

# Each command's name and the module that registers it: a command line names one, and only
# that module is imported (the benchmarks import torch, which a simulation never needs).
COMMANDS = {
    "generate": "lenserve.commands.generate",
    "bench": "lenserve.commands.bench",
    "bench-executor": "lenserve.commands.bench_executor",
    "bench-attention": "lenserve.commands.bench_attention",
    "bench-scheduler": "lenserve.commands.bench_scheduler",
    "bench-swap": "lenserve.commands.bench_swap",
    "predictor": "lenserve.commands.predictor",
    "serve": "lenserve.commands.serve",
    "serve-scheduler": "lenserve.commands.serve_services",
    "serve-executor": "lenserve.commands.serve_services",
    "serve-kvmanager": "lenserve.commands.serve_services",
    "serve-gateway": "lenserve.commands.serve_services",
    "serve-router": "lenserve.commands.serve_services",
    "up": "lenserve.commands.up",
    "bench-transport": "lenserve.commands.bench_transport",
    "profile": "lenserve.commands.profile",
    "simulate": "lenserve.commands.simulate",
}
COMMAND_MODULES = list(dict.fromkeys(COMMANDS.values()))
# Commands that never run a Triton kernel, so need not choose Triton's mode first.
NO_KERNEL_COMMANDS = frozenset({"simulate"})


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser of every command, or only of ``command`` (its module alone is imported)
    when that names one."""
    parser = argparse.ArgumentParser(prog="lenserve", description="LLM serving with length-aware scheduling")
    parser.add_argument("--debug", action="store_true", help=DEBUG_HELP)
    subparsers = parser.add_subparsers(dest="command", required=True)
    modules = [COMMANDS[command]] if command in COMMANDS else COMMAND_MODULES
    for name in modules:
        importlib.import_module(name).register(subparsers)
    for sub in subparsers.choices.values():
        add_debug_flag(sub)
    return parser


def command_of(argv: list[str]) -> str | None:
    """The command a command line names: its first word that is not an option (``--debug``,
    the only option before it, takes no value)."""
    return next((word for word in argv if not word.startswith("-")), None)


def add_debug_flag(parser: argparse.ArgumentParser) -> None:
    """``--debug`` after any (sub)command too. SUPPRESS keeps a subcommand that was not given
    the flag from resetting what an earlier parser set."""
    parser.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=DEBUG_HELP)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                add_debug_flag(sub)


def interpret_triton_without_cuda() -> None:
    """Without CUDA, Triton kernels run only in Triton's interpreter, and Triton chooses compiled
    or interpreted once per function, when ``@triton.jit`` runs: for its own helpers
    (``tl.cdiv``, ...) that is when ``triton.language`` is first imported, which torch and
    transformers do while the commands load. So the choice is made here, before any of them."""
    if "TRITON_INTERPRET" in os.environ:
        return
    import torch  # importing torch and asking for CUDA does not import triton

    if not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"


@contextlib.contextmanager
def command_logging(debug: bool):
    """lenserve's own log records, one line each, while a command runs; tracebacks and debug
    records only with --debug.

    A logged exception is also handed back as the failed request's error (the engine finishes
    the request with it), which the command reports as its one-line error: without --debug
    the record would only repeat it, with a traceback the user did not ask for. Only lenserve's
    loggers are touched; other packages' logging (the predictor service sets up its own) is
    left as it is. A handler here also keeps logging's last-resort printer, which prints
    tracebacks, from taking lenserve's records."""
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("lenserve: %(message)s"))
    if not debug:
        handler.addFilter(lambda record: record.exc_info is None)
    loggers = [logging.getLogger(name) for name in _COMMAND_LOGGERS]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.addHandler(handler)
        logger.setLevel(logging.DEBUG if debug else logging.WARNING)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.removeHandler(handler)
            logger.setLevel(level)


# The serving loop and its parts log under their own packages; the predictor service keeps
# its own logging set-up.
_COMMAND_LOGGERS = ("lenserve", "services.scheduler", "services.executor", "services.kvmanager")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    command = command_of(argv)
    if command not in NO_KERNEL_COMMANDS:
        interpret_triton_without_cuda()
    args = build_parser(command).parse_args(argv)
    with command_logging(args.debug):
        return run_command(args)


def run_command(args: argparse.Namespace) -> int:
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130
    except (ValueError, FileNotFoundError) as exc:
        # Bad input reaches the user as one clear line, not a traceback.
        if args.debug:
            raise
        print(f"lenserve {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:
        if args.debug:
            raise
        print(f"lenserve {args.command}: error: {type(exc).__name__}: {exc} "
              "(--debug shows the traceback)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
