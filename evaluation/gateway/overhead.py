"""TTFT the gateway adds: the same engine (fake model), called directly and through HTTP,
requests alternating one at a time so both see the same load.

The HTTP side is timed with httpx (what a Python app sees) or, with ``--client raw``, with
one keep-alive socket that writes the request bytes and looks for the first event in what
comes back: httpx spends about 1.4 ms of its own per request on this 2-core machine (a GET
/health: 1.9 ms with httpx, 0.5 ms over the raw socket), which is the client's cost, not
the gateway's.

    python3 -m evaluation.gateway.overhead --requests 300          # engine and gateway in-process
    python3 -m evaluation.gateway.overhead --requests 300 --stack  # `lenserve up`: the gRPC SDK
                                                                   # to the scheduler vs the gateway
    python3 -m evaluation.gateway.overhead --app-only              # the ASGI app alone, over a
                                                                   # scheduler that answers at once
"""
from __future__ import annotations

import argparse
import asyncio
import functools
import json
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
from lenserve_contract.outputs import CompletionOutput, RequestOutput
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


class RawClient:
    """HTTP/1.1 over one keep-alive socket, just enough for a streamed completion: the
    request as bytes, then the response read until its first event (TTFT) and its last."""

    def __init__(self, url: str):
        self.host, _, port = url.removeprefix("http://").rpartition(":")
        self.port = int(port)

    async def __aenter__(self):
        self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        return self

    async def __aexit__(self, *exc):
        self.writer.close()

    async def stream(self, max_tokens: int) -> float:
        body = json.dumps({"prompt": PROMPT, "max_tokens": max_tokens, "ignore_eos": True,
                           "stream": True}).encode()
        head = (f"POST /v1/completions HTTP/1.1\r\nHost: {self.host}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n")
        t0 = time.perf_counter()
        self.writer.write(head.encode() + body)
        seen, ttft = b"", None
        while not seen.endswith(b"0\r\n\r\n"):      # the chunked body's last chunk
            data = await self.reader.read(65536)
            if not data:
                raise ConnectionError("the gateway closed the connection")
            seen += data
            if ttft is None and b"data: {" in seen:
                ttft = time.perf_counter() - t0
        if b" 200 " not in seen.split(b"\r\n", 1)[0] or b"data: [DONE]" not in seen:
            raise RuntimeError(f"unexpected response: {seen[:200]!r}")
        return ttft


async def measure(engine, url: str, n: int, max_tokens: int, client_kind: str = "httpx"):
    direct, via = [], []
    if client_kind == "raw":
        client = RawClient(url)
        timed = client.stream
    else:
        client = httpx.AsyncClient(base_url=url, timeout=30)
        timed = functools.partial(gateway_ttft, client)
    async with client:
        for i in range(n + 20):                       # the first 20 warm up
            d = await direct_ttft(engine, max_tokens)
            g = await timed(max_tokens)
            if i >= 20:
                direct.append(d)
                via.append(g)
    return direct, via


ROOT = Path(__file__).resolve().parents[2]


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
              f"overhead {g50 - d50:.3f} ms ({args.requests} requests each, {args.client})")


class InstantBackend:
    """A scheduler that answers every request at once with ``max_tokens`` one-token deltas."""

    def generate(self, prompt=None, sampling_params=None, request_id=None, **kwargs):
        n = sampling_params.max_tokens

        async def deltas():
            for i in range(n):
                yield RequestOutput(request_id, prompt, [1, 2, 3], [CompletionOutput(
                    0, " tok", [5], finish_reason="length" if i == n - 1 else None)],
                    finished=i == n - 1)
        return deltas()

    async def abort(self, request_id: str) -> bool:
        return False

    async def stats(self):
        return None


def app_only(args) -> None:
    """The gateway's own time per streamed request: the ASGI app called directly (no socket,
    no server), p50 to its first event and to its end."""
    app = create_app(InstantBackend(), GatewayConfig(served_model_name="fake"))
    body = json.dumps({"prompt": PROMPT, "max_tokens": args.max_tokens, "ignore_eos": True,
                       "stream": True}).encode()
    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"},
             "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": "/v1/completions", "raw_path": b"/v1/completions", "query_string": b"",
             "root_path": "", "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 2),
             "headers": [(b"content-type", b"application/json"),
                         (b"content-length", str(len(body)).encode())]}

    async def one() -> tuple[float, float]:
        messages = [{"type": "http.request", "body": body, "more_body": False}]
        first = []

        async def receive():
            if messages:
                return messages.pop()
            await asyncio.Event().wait()              # the client never leaves

        async def send(message):
            if message["type"] == "http.response.body" and message["body"] and not first:
                first.append(time.perf_counter())
        t0 = time.perf_counter()
        await app(dict(scope), receive, send)
        return first[0] - t0, time.perf_counter() - t0

    async def runs():
        for _ in range(200):                          # warm-up
            await one()
        for run in range(args.runs):
            first, whole = zip(*[await one() for _ in range(args.requests)])
            print(f"run {run + 1}: p50 to the first event {statistics.median(first) * 1e6:.0f} "
                  f"us, to the end {statistics.median(whole) * 1e6:.0f} us ({args.requests} "
                  f"requests of {args.max_tokens} tokens)")
    asyncio.run(runs())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--requests", type=int, default=300)
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--runs", type=int, default=2)
    p.add_argument("--client", choices=["httpx", "raw"], default="httpx",
                   help="HTTP client timing the gateway (raw: a bare socket; see above)")
    p.add_argument("--stack", action="store_true",
                   help="measure the split services of `lenserve up` instead")
    p.add_argument("--app-only", action="store_true",
                   help="time the gateway's ASGI app alone over an instant scheduler")
    args = p.parse_args()
    if args.app_only:
        return app_only(args)
    if args.stack:
        from lenserve.client import AsyncClient

        log = Path(tempfile.gettempdir()) / f"lenserve-overhead-{os.getpid()}.log"
        proc, scheduler, gateway = start_stack(log)
        print(f"direct: the gRPC SDK to {scheduler}; gateway: {gateway}")

        async def one_run():
            async with AsyncClient(scheduler) as client:
                return await measure(client, gateway, args.requests, args.max_tokens,
                                     args.client)
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
                                                 args.max_tokens, args.client)))
    finally:
        server.stop()
        engine.shutdown()


if __name__ == "__main__":
    main()
