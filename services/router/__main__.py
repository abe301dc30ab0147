"""`python -m services.router` / `lenserve serve-router`: CLI/env -> one frozen config -> the
router service in front of scheduler replicas (a static list or a DNS name)."""
from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys

from services.router.config import DEFAULT_PORT, RouterConfig
from services.router.discovery import parse_replicas
from services.router.policies import DEFAULT_POLICY, POLICIES

log = logging.getLogger("lenserve.router")


def add_arguments(p: argparse.ArgumentParser) -> None:
    env = os.environ.get
    p.add_argument("--replicas", default=env("LENSERVE_REPLICAS"), required=not env(
                   "LENSERVE_REPLICAS"),
                   help="scheduler replicas: HOST:PORT[,HOST:PORT...] or dns://NAME:PORT "
                        "(a headless service; looked up again every --dns-refresh seconds)")
    p.add_argument("--policy", default=env("LENSERVE_ROUTER_POLICY", DEFAULT_POLICY),
                   choices=sorted(POLICIES), help="placement policy")
    p.add_argument("--no-prefix-affinity", action="store_true",
                   default=env("LENSERVE_ROUTER_PREFIX_AFFINITY", "1") == "0",
                   help="place without the prefix map (length-aware and prefix-affinity count "
                        "the prompt blocks a replica likely holds cached unless this is given)")
    p.add_argument("--predictor", default=env("LENSERVE_PREDICTOR") or None,
                   help="grpc://HOST:PORT of the predictor service (length-aware predicts each "
                        "prompt once, here); default none: lengths default")
    p.add_argument("--host", default=env("LENSERVE_ROUTER_HOST", "127.0.0.1"))
    p.add_argument("--port", type=int, default=int(env("LENSERVE_ROUTER_PORT", DEFAULT_PORT)))
    p.add_argument("--hold", type=float, default=30.0,
                   help="seconds a request may wait for a replica to be up")
    p.add_argument("--load-interval", type=float, default=0.1,
                   help="seconds between a replica's load reports")
    p.add_argument("--dns-refresh", type=float, default=5.0)
    p.add_argument("--grace", type=float, default=5.0, help="seconds to finish streams on stop")


def config_from_args(args: argparse.Namespace) -> RouterConfig:
    return RouterConfig(parse_replicas(args.replicas), args.policy, args.predictor,
                        args.host, args.port, args.hold, args.load_interval, args.dns_refresh,
                        args.grace, not args.no_prefix_affinity)


def build_router(config: RouterConfig):
    from services.router.core import RouterCore
    from services.router.runtime import Router
    predictor = None
    if config.predictor is not None:
        from services.predictor.client import AsyncPredictorClient
        predictor = AsyncPredictorClient(config.predictor.removeprefix("grpc://"))
    return Router(RouterCore(config.policy, config.prefix_affinity), predictor,
                  hold_s=config.hold_s, load_interval_s=config.load_interval_s)


async def serve_async(config: RouterConfig) -> int:
    from services import rpc
    from services.router.discovery import follow
    from services.router.servicer import build_server, mark_serving

    router = build_router(config)
    server, port = build_server(router, f"{config.host}:{config.port}")
    discovery = asyncio.ensure_future(follow(config.replicas, router.set_replicas,
                                             config.dns_refresh_s))
    await server.start()
    await mark_serving(server)
    log.info("router (%s) serving on %s:%d in front of %s", config.policy, config.host, port,
             ",".join(config.replicas))
    await rpc.wait_for_signal()
    await server.stop(grace=config.grace_s)
    discovery.cancel()
    core = router.core
    log.info("router placed %d requests, %.1f us per placement decision (mean)",
             core.num_placements, core.place_ns / 1000 / max(core.num_placements, 1))
    await router.close()
    return 0


def serve(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    try:
        config = config_from_args(args)
    except ValueError as exc:
        print(f"router: {exc}", file=sys.stderr)
        return 2
    return asyncio.run(serve_async(config))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m services.router",
                                     description="the lenserve router: one scheduler contract "
                                                 "in front of N scheduler replicas")
    add_arguments(parser)
    return serve(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
