"""TTFT the gateway adds: the same engine (fake model), called directly and through HTTP,
requests alternating one at a time so both see the same load.

    python scripts/gateway_overhead.py --requests 300
"""
from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import httpx

from gateway import GatewayConfig, create_app
from gateway.server import ServerThread
from lenserve_contract.sampling_params import SamplingParams
from services.scheduler.async_engine import AsyncEngine
from services.scheduler.wiring import EngineConfig

PROMPT = "The quick brown fox jumps over the lazy dog. " * 4


async def direct_ttft(engine: AsyncEngine, max_tokens: int) -> float:
    t0 = time.perf_counter()
    stream = engine.generate(PROMPT, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
    async for out in stream:
        if out.outputs[0].token_ids:
            ttft = time.perf_counter() - t0
            break
    async for _ in stream:
        pass
    return ttft


async def gateway_ttft(client: httpx.AsyncClient, max_tokens: int) -> float:
    body = {"prompt": PROMPT, "max_tokens": max_tokens, "ignore_eos": True, "stream": True}
    t0 = time.perf_counter()
    ttft = None
    async with client.stream("POST", "/v1/completions", json=body) as resp:
        async for line in resp.aiter_lines():
            if ttft is None and line.startswith("data: {"):
                ttft = time.perf_counter() - t0
    return ttft


async def measure(engine: AsyncEngine, url: str, n: int, max_tokens: int):
    direct, via = [], []
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        for i in range(n + 20):                       # the first 20 warm up
            d = await direct_ttft(engine, max_tokens)
            g = await gateway_ttft(client, max_tokens)
            if i >= 20:
                direct.append(d)
                via.append(g)
    return direct, via


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--requests", type=int, default=300)
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--runs", type=int, default=2)
    args = p.parse_args()
    engine = AsyncEngine(EngineConfig(model="fake"))
    server = ServerThread(create_app(engine, GatewayConfig(served_model_name="fake"))).start()
    try:
        for run in range(args.runs):
            direct, via = asyncio.run(measure(engine, server.url, args.requests, args.max_tokens))
            d50, g50 = statistics.median(direct) * 1e3, statistics.median(via) * 1e3
            print(f"run {run + 1}: TTFT p50 direct {d50:.3f} ms, gateway {g50:.3f} ms, "
                  f"overhead {g50 - d50:.3f} ms ({args.requests} requests each)")
    finally:
        server.stop()
        engine.shutdown()


if __name__ == "__main__":
    main()
