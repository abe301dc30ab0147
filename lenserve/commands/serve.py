"""``lenserve serve``: the whole OpenAI-compatible API from one process, an in-process
``AsyncEngine`` behind the gateway.

    lenserve serve --model opt-125m --port 8000
    curl http://127.0.0.1:8000/v1/completions -d '{"prompt": "Hello", "max_tokens": 8}'
"""
from __future__ import annotations

import argparse
import logging
import sys

from gateway.config import add_gateway_arguments, gateway_config
from lenserve.commands.engine_args import add_engine_arguments, engine_options
from services.executor.attention.registry import BACKEND_CHOICES
from services.hardware import DTYPE_AUTO_HELP


def register(subparsers) -> None:
    p = subparsers.add_parser("serve", help="serve the OpenAI-compatible API (engine + gateway)",
                              description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True,
                   help="model path, Hugging Face hub id (org/name) or preset ('fake': no model)")
    p.add_argument("--policy", default="vllm")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--max-num-batched-tokens", type=int, default=2048)
    p.add_argument("--attention-backend", default="auto", choices=BACKEND_CHOICES)
    p.add_argument("--dtype", default="auto",
                   help=DTYPE_AUTO_HELP)
    p.add_argument("--device", default="cpu")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"])
    add_engine_arguments(p)
    add_gateway_arguments(p)
    p.set_defaults(func=run)


def engine_config(args: argparse.Namespace):
    from services.scheduler.wiring import EngineConfig
    return EngineConfig(model=args.model, policy=args.policy, block_size=args.block_size,
                        max_model_len=args.max_model_len,
                        max_num_batched_tokens=args.max_num_batched_tokens,
                        attention_backend=args.attention_backend, dtype=args.dtype,
                        device=args.device, seed=args.seed, **engine_options(args))


def run(args: argparse.Namespace) -> int:
    from gateway import create_app
    from gateway.server import bind, make_server, url_of
    from services.scheduler.async_engine import AsyncEngine

    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    config = gateway_config(args, model=args.model)
    sock = bind(config.host, config.port)     # before the model loads: a taken port fails fast
    engine = AsyncEngine(engine_config(args))
    app = create_app(engine, config, tokenizer=engine.engine.tokenizer)
    server = make_server(app, args.log_level)
    auth = "API key required" if config.api_keys else "open, no API key"
    info = engine.engine.model_info
    print(f"lenserve serving {config.served_model_name} ({info.dtype}) at {url_of(sock)}/v1 "
          f"({auth}); Ctrl-C stops", file=sys.stderr, flush=True)
    try:
        server.run(sockets=[sock])       # uvicorn handles Ctrl-C: drains, then returns
    finally:
        engine.shutdown()
        sock.close()
    return 0
