"""`python -m services.kvmanager` / `lenserve serve-kvmanager`: CLI/env -> one frozen config ->
the KV manager service (the host KV tier) next to an executor service on the same host.

Block bytes move with the executor through shared memory, so both must see the same
``/dev/shm`` (one host; in containers, a shared IPC namespace)."""
from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from dataclasses import dataclass

from services.kvmanager.config import KVManagerConfig

log = logging.getLogger("lenserve.kvmanager")
DEFAULT_PORT = 50054  # documented default; override with --port or LENSERVE_KVMANAGER_PORT


@dataclass(frozen=True)
class KVManagerServiceConfig:
    kv: KVManagerConfig
    executor: str = "grpc://127.0.0.1:50052"
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    grace_s: float = 5.0
    connect_timeout_s: float = 300.0    # how long to wait for the executor to come up

    def __post_init__(self) -> None:
        if not self.executor.startswith("grpc://"):
            raise ValueError(f"--executor must be grpc://HOST:PORT, got {self.executor!r}")


def _env_bool(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def add_arguments(p: argparse.ArgumentParser) -> None:
    env = os.environ.get
    p.add_argument("--executor", default=env("LENSERVE_EXECUTOR", "grpc://127.0.0.1:50052"),
                   help="the executor service whose KV blocks this tier holds (same host)")
    p.add_argument("--swap-space", type=float,
                   default=float(env("LENSERVE_SWAP_SPACE_GIB", "4")),
                   help="GiB of host memory for swapped-out KV blocks")
    p.add_argument("--int8", action="store_true", default=_env_bool("LENSERVE_KV_INT8"),
                   help="keep host blocks as channel-wise INT8 (about 1/4 of fp32)")
    p.add_argument("--num-workers", type=int, default=1,
                   help="copy threads (one keeps copies in submission order)")
    # Loopback unless told otherwise: exposing the service is a deployment decision.
    p.add_argument("--host", default=env("LENSERVE_KVMANAGER_HOST", "127.0.0.1"))
    p.add_argument("--port", type=int,
                   default=int(env("LENSERVE_KVMANAGER_PORT", DEFAULT_PORT)))
    p.add_argument("--grace", type=float, default=5.0, help="seconds to finish calls on stop")


def config_from_args(args: argparse.Namespace) -> KVManagerServiceConfig:
    kv = KVManagerConfig(args.swap_space, int8=args.int8, pin_memory=False,
                         num_workers=args.num_workers)
    return KVManagerServiceConfig(kv, args.executor, args.host, args.port, args.grace)


def build_core(config: KVManagerServiceConfig):
    """The in-process core over a gRPC executor client as its mover (bytes through shared
    memory); waits for the executor to answer."""
    from services import shm
    from services.executor.client import ExecutorClient
    from services.kvmanager.core import InProcessKVManager

    stale = shm.remove_stale()
    if stale:
        log.info("removed %d shared memory segments of a previous kvmanager", len(stale))
    mover = ExecutorClient(config.executor, connect_timeout_s=config.connect_timeout_s)
    return InProcessKVManager(config.kv, mover, mover.model_info(), device="cpu")


async def serve_async(config: KVManagerServiceConfig) -> int:
    from services import rpc
    from services.kvmanager.servicer import build_server, mark_serving

    core = build_core(config)
    server, port, servicer = build_server(core, f"{config.host}:{config.port}")
    await server.start()
    await mark_serving(server)
    log.info("kvmanager serving %d host blocks (%s, %.2f GiB) for the executor at %s on %s:%d",
             core.num_host_blocks, "INT8" if config.kv.int8 else "exact",
             config.kv.swap_space_gib, config.executor, config.host, port)
    await rpc.wait_for_signal()
    await server.stop(grace=config.grace_s)
    servicer.close()
    core.mover.close()
    return 0


def serve(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    return asyncio.run(serve_async(config_from_args(args)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m services.kvmanager",
                                     description="the lenserve KV manager gRPC service")
    add_arguments(parser)
    return serve(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
