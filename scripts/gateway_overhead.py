"""TTFT the gateway adds: the same engine (fake model), called directly and through HTTP,
requests alternating one at a time so both see the same load.

    python scripts/gateway_overhead.py --requests 300            # engine and gateway in-process
    python scripts/gateway_overhead.py --requests 300 --stack    # `lenserve up`: the gRPC SDK
                                                                 # to the scheduler vs the gateway
"""
from __future__ import annotations

import argparse
import asyncio
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from gateway import GatewayConfig, create_app
from gateway.server import ServerThread
from lenserve_contract.sampling_params import SamplingParams
from services.scheduler.async_engine import AsyncEngine
from services.scheduler.wiring import EngineConfig

PROMPT = "The quick brown fox jumps over the lazy dog. " * 4


async def direct_ttft(engine, max_tokens: int) -> float:
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


async def measure(engine, url: str, n: int, max_tokens: int):
    direct, via = [], []
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        for i in range(n + 20):                       # the first 20 warm up
            d = await direct_ttft(engine, max_tokens)
            g = await gateway_ttft(client, max_tokens)
            if i >= 20:
                direct.append(d)
                via.append(g)
    return direct, via


ROOT = Path(__file__).resolve().parent.parent


def start_stack(log: Path) -> tuple[subprocess.Popen, str, str]:
    """``lenserve up --model fake --no-predictor``; its scheduler target and gateway URL."""
    cmd = [sys.executable, "-m", "lenserve.cli", "up", "--model", "fake", "--no-predictor"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log.open("w"),
                            stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        text = log.read_text()
        if "ready" in text:
            scheduler = re.search(r"scheduler\s+grpc://(\S+)", text).group(1)
            gateway = re.search(r"gateway\s+(http://\S+)", text).group(1)
            return proc, scheduler, gateway
        if proc.poll() is not None:
            raise SystemExit(text)
        time.sleep(0.2)
    proc.terminate()
    raise SystemExit("lenserve up did not start")


def report(args, measure_run) -> None:
    for run in range(args.runs):
        direct, via = measure_run()
        d50, g50 = statistics.median(direct) * 1e3, statistics.median(via) * 1e3
        print(f"run {run + 1}: TTFT p50 direct {d50:.3f} ms, gateway {g50:.3f} ms, "
              f"overhead {g50 - d50:.3f} ms ({args.requests} requests each)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--requests", type=int, default=300)
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--runs", type=int, default=2)
    p.add_argument("--stack", action="store_true",
                   help="measure the split services of `lenserve up` instead")
    args = p.parse_args()
    if args.stack:
        from lenserve.client import AsyncClient

        log = Path(tempfile.gettempdir()) / f"lenserve-overhead-{os.getpid()}.log"
        proc, scheduler, gateway = start_stack(log)
        print(f"direct: the gRPC SDK to {scheduler}; gateway: {gateway}")

        async def one_run():
            async with AsyncClient(scheduler) as client:
                return await measure(client, gateway, args.requests, args.max_tokens)
        try:
            report(args, lambda: asyncio.run(one_run()))
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
        return
    engine = AsyncEngine(EngineConfig(model="fake"))
    server = ServerThread(create_app(engine, GatewayConfig(served_model_name="fake"))).start()
    try:
        report(args, lambda: asyncio.run(measure(engine, server.url, args.requests,
                                                 args.max_tokens)))
    finally:
        server.stop()
        engine.shutdown()


if __name__ == "__main__":
    main()
