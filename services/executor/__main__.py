"""`python -m services.executor` / `lenserve serve-executor`: CLI/env -> one frozen config ->
the executor service."""
from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from dataclasses import dataclass

from services.executor.factory import ExecutorConfig
from services.hardware import DTYPE_AUTO_HELP

log = logging.getLogger("lenserve.executor")
DEFAULT_PORT = 50052  # documented default; override with --port or LENSERVE_EXECUTOR_PORT


@dataclass(frozen=True)
class ExecutorServiceConfig:
    executor: ExecutorConfig
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    grace_s: float = 5.0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=os.environ.get("LENSERVE_MODEL", "opt-tiny"),
                   help="model path or preset ('fake': no model)")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--num-gpu-blocks", type=int, default=None,
                   help="device KV blocks (default: from memory)")
    p.add_argument("--kv-cache-memory-bytes", type=int, default=None)
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--attention-backend", default="auto")
    p.add_argument("--dtype", default="auto",
                   help=DTYPE_AUTO_HELP)
    p.add_argument("--enforce-eager", action="store_true",
                   help="run decode iterations eagerly instead of replaying CUDA graphs")
    p.add_argument("--device", default="cpu")
    p.add_argument("--seed", type=int, default=0)
    # Loopback unless told otherwise: exposing the service is a deployment decision.
    p.add_argument("--host", default=os.environ.get("LENSERVE_EXECUTOR_HOST", "127.0.0.1"))
    p.add_argument("--port", type=int,
                   default=int(os.environ.get("LENSERVE_EXECUTOR_PORT", DEFAULT_PORT)))
    p.add_argument("--grace", type=float, default=5.0, help="seconds to finish calls on stop")


def config_from_args(args: argparse.Namespace) -> ExecutorServiceConfig:
    executor = ExecutorConfig(
        args.model, block_size=args.block_size, num_gpu_blocks=args.num_gpu_blocks,
        kv_cache_memory_bytes=args.kv_cache_memory_bytes, attention_backend=args.attention_backend,
        dtype=args.dtype, device=args.device, max_model_len=args.max_model_len, seed=args.seed,
        enforce_eager=args.enforce_eager)
    return ExecutorServiceConfig(executor, args.host, args.port, args.grace)


async def serve_async(config: ExecutorServiceConfig) -> int:
    from services import rpc
    from services.executor.factory import build_executor
    from services.executor.servicer import build_server, compute_thread, mark_serving
    from services.hardware import keep_torch_single_threaded

    keep_torch_single_threaded()        # the event loop's thread only converts messages
    worker = compute_thread()
    executor = await asyncio.get_running_loop().run_in_executor(worker, build_executor,
                                                                config.executor)
    server, port, servicer = build_server(executor, f"{config.host}:{config.port}", worker)
    await server.start()
    await mark_serving(server)
    info = executor.model_info()
    log.info("executor serving %s (%s, %d blocks of %d tokens) on %s:%d", info.name,
             info.dtype, info.num_gpu_blocks, info.block_size, config.host, port)
    await rpc.wait_for_signal()
    await server.stop(grace=config.grace_s)
    servicer.close()
    return 0


def serve(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    return asyncio.run(serve_async(config_from_args(args)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m services.executor",
                                     description="the lenserve executor gRPC service")
    add_arguments(parser)
    return serve(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
