"""`python -m services.scheduler` / `lenserve serve-scheduler`: CLI/env -> one frozen config ->
the scheduler service over an in-process executor, or a remote one (``--executor grpc://``)
with, optionally, the host KV tier of a kvmanager service (``--kvmanager grpc://``)."""
from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from dataclasses import dataclass

from services.hardware import DTYPE_AUTO_HELP
from services.scheduler.engine_args import add_engine_arguments, engine_options
from services.scheduler.wiring import EngineConfig

log = logging.getLogger("lenserve.scheduler")
DEFAULT_PORT = 50051  # documented default; override with --port or LENSERVE_SCHEDULER_PORT
IN_PROCESS = "inprocess"


@dataclass(frozen=True)
class SchedulerServiceConfig:
    engine: EngineConfig
    executor: str = IN_PROCESS     # or grpc://HOST:PORT
    kvmanager: str | None = None   # grpc://HOST:PORT of a kvmanager next to the executor
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    grace_s: float = 5.0

    def __post_init__(self) -> None:
        if self.executor != IN_PROCESS and not self.executor.startswith("grpc://"):
            raise ValueError(f"--executor must be {IN_PROCESS!r} or grpc://HOST:PORT, "
                             f"got {self.executor!r}")
        if self.executor != IN_PROCESS and self.engine.swap_space_gib > 0:
            raise ValueError("--swap-space needs the executor in-process: the host tier of a "
                             "remote executor is a kvmanager service (--kvmanager grpc://)")
        if self.kvmanager is not None:
            if not self.kvmanager.startswith("grpc://"):
                raise ValueError(f"--kvmanager must be grpc://HOST:PORT, got {self.kvmanager!r}")
            if self.executor == IN_PROCESS:
                raise ValueError("--kvmanager needs --executor grpc://: the kvmanager moves "
                                 "blocks with an executor service (an in-process executor "
                                 "takes --swap-space instead)")


def add_arguments(p: argparse.ArgumentParser) -> None:
    env = os.environ.get
    p.add_argument("--model", default=env("LENSERVE_MODEL", "opt-tiny"),
                   help="model path or preset ('fake': no model); with a remote executor, "
                        "where the tokenizer comes from")
    p.add_argument("--executor", default=env("LENSERVE_EXECUTOR", IN_PROCESS),
                   help=f"{IN_PROCESS} (this process) or grpc://HOST:PORT")
    p.add_argument("--kvmanager", default=env("LENSERVE_KVMANAGER") or None,
                   help="grpc://HOST:PORT of a kvmanager service (the host KV tier of the "
                        "remote executor); default none")
    p.add_argument("--policy", default=env("LENSERVE_POLICY", "vllm"))
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--max-num-batched-tokens", type=int, default=2048)
    p.add_argument("--dtype", default="auto",
                   help=DTYPE_AUTO_HELP)
    p.add_argument("--device", default="cpu")
    add_engine_arguments(p)
    p.set_defaults(predictor=env("LENSERVE_PREDICTOR", "none"))
    p.add_argument("--kafka-bootstrap", default=env("LENSERVE_KAFKA_BOOTSTRAP"),
                   help="send completion records to Kafka (the predictor learns from them)")
    p.add_argument("--kafka-max-buffered", type=_at_least_one,
                   default=env("LENSERVE_KAFKA_MAX_BUFFERED", "10000"),
                   help="completion records kept while Kafka is unreachable; past it the oldest "
                        "are dropped (counted in lenserve_kafka_completions_dropped_total)")
    # Loopback unless told otherwise: exposing the service is a deployment decision.
    p.add_argument("--host", default=env("LENSERVE_SCHEDULER_HOST", "127.0.0.1"))
    p.add_argument("--port", type=int, default=int(env("LENSERVE_SCHEDULER_PORT", DEFAULT_PORT)))
    p.add_argument("--grace", type=float, default=5.0, help="seconds to finish streams on stop")


def _at_least_one(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def config_from_args(args: argparse.Namespace) -> SchedulerServiceConfig:
    engine = EngineConfig(model=args.model, policy=args.policy, block_size=args.block_size,
                          max_model_len=args.max_model_len,
                          max_num_batched_tokens=args.max_num_batched_tokens, dtype=args.dtype,
                          device=args.device, kafka_bootstrap=args.kafka_bootstrap,
                          kafka_max_buffered=args.kafka_max_buffered,
                          **engine_options(args))
    return SchedulerServiceConfig(engine, args.executor, args.kvmanager, args.host, args.port,
                                  args.grace)


def build_engine(config: SchedulerServiceConfig):
    from services.scheduler.async_engine import AsyncEngine
    from services.scheduler.engine_core import EngineCore
    from services.scheduler.policies.time_model import ExecutionTimeModel
    from services.scheduler.wiring import engine_parts

    def build() -> EngineCore:     # on the engine's thread: an in-process model loads there
        executor = kv_manager = None
        if config.executor != IN_PROCESS:
            from services.executor.client import ExecutorClient
            executor = ExecutorClient(config.executor, tokenizer_model=config.engine.model)
        if config.kvmanager is not None:
            from services.kvmanager.client import KVManagerClient
            kv_manager = KVManagerClient(config.kvmanager)
        parts = engine_parts(config.engine, executor, kv_manager=kv_manager)
        # Its own time model, fitted whatever the policy: the load a router places by.
        return EngineCore(**parts, tokenizer=parts["executor"].tokenizer,
                          time_model=ExecutionTimeModel())

    return AsyncEngine(build)


async def serve_async(config: SchedulerServiceConfig) -> int:
    from services import rpc
    from services.scheduler.servicer import build_server, mark_serving

    engine = build_engine(config)
    server, port = build_server(engine, f"{config.host}:{config.port}")
    servicer = server.servicer          # type: ignore[attr-defined]
    await server.start()
    await mark_serving(server)
    log.info("scheduler serving %s (policy %s, executor %s) on %s:%d",
             engine.engine.model_info.name, config.engine.policy, config.executor,
             config.host, port)
    await rpc.wait_for_signal()
    servicer.draining = True                  # load reports say so: routers place elsewhere
    await asyncio.sleep(min(config.grace_s, 0.3))
    await server.stop(grace=config.grace_s)   # open streams finish or are aborted
    engine.shutdown()
    engine.engine.close()
    return 0


def serve(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    return asyncio.run(serve_async(config_from_args(args)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m services.scheduler",
                                     description="the lenserve scheduler gRPC service")
    add_arguments(parser)
    return serve(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
