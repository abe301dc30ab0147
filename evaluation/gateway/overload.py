"""Overload ``lenserve serve``: measure the sustainable rate, then offer 10x that for a bounded
time. Every request must end with 200, 429 or 503 (none hangs); reports the server's peak RSS.

    python3 -m evaluation.gateway.overload --model fake --seconds 10
    python3 -m evaluation.gateway.overload --model opt-125m --seconds 60
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]


def start_server(args, log: Path) -> tuple[subprocess.Popen, str]:
    cmd = [sys.executable, "-m", "lenserve.cli", "serve", "--model", args.model, "--port", "0",
           "--max-waiting", str(args.max_waiting), "--max-concurrency",
           str(args.max_concurrency), *args.engine_args]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stderr=log.open("w"))
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        found = re.search(r"http://[\d.]+:\d+", log.read_text())
        if found:
            return proc, found.group(0)
        if proc.poll() is not None:
            raise SystemExit(log.read_text())
        time.sleep(0.2)
    raise SystemExit("the server did not start")


async def one(url: str, max_tokens: int, timeout_s: float) -> str:
    """One request on its own connection, spoken in plain HTTP/1.1: a client pool with
    thousands of connections (httpx) would be the bottleneck, not the server."""
    host, port = httpx.URL(url).host, httpx.URL(url).port
    body = json.dumps({"prompt": "Tell me a story about a fox.", "max_tokens": max_tokens,
                       "ignore_eos": True}).encode()
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json"
            f"\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
    try:
        return await asyncio.wait_for(exchange(host, port, head + body), timeout_s)
    except asyncio.TimeoutError:
        return "hung"
    except OSError as exc:
        return type(exc).__name__


async def exchange(host: str, port: int, request: bytes) -> str:
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(request)
        status = (await reader.readline()).split()
        await reader.read()
        return status[1].decode() if len(status) > 1 else "no-status"
    finally:
        writer.close()


async def burst(url: str, n: int, max_tokens: int) -> float:
    """Requests/s at saturation: n sent at once, all must succeed."""
    t0 = time.perf_counter()
    codes = await asyncio.gather(*(one(url, max_tokens, 300) for _ in range(n)))
    elapsed = time.perf_counter() - t0
    assert set(codes) == {"200"}, collections.Counter(codes)
    return n / elapsed


async def overload(url: str, rate: float, seconds: float, max_tokens: int, timeout_s: float):
    tasks, t0 = [], time.perf_counter()
    while (now := time.perf_counter() - t0) < seconds:
        due = int(now * rate) + 1
        while len(tasks) < due:
            tasks.append(asyncio.create_task(one(url, max_tokens, timeout_s)))
        await asyncio.sleep(0.002)
    codes = await asyncio.gather(*tasks)
    return collections.Counter(codes), len(tasks) / seconds, time.perf_counter() - t0


def peak_rss_mib(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmHWM:\s+(\d+)", status).group(1)) / 1024


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model", default="fake")
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--burst", type=int, default=48, help="below --max-waiting: none refused")
    p.add_argument("--max-waiting", type=int, default=64)
    p.add_argument("--max-concurrency", type=int, default=256)
    p.add_argument("--timeout", type=float, default=60.0, help="a request slower than this hung")
    p.add_argument("engine_args", nargs="*", help="more `lenserve serve` flags (after --)")
    args = p.parse_args()
    log = Path(f"/tmp/lenserve-overload-{os.getpid()}.log")
    proc, url = start_server(args, log)
    try:
        sustainable = asyncio.run(burst(url, args.burst, args.max_tokens))
        print(f"sustainable: {sustainable:.1f} req/s ({args.burst} at once, "
              f"{args.max_tokens} tokens each); server peak RSS so far "
              f"{peak_rss_mib(proc.pid):.0f} MiB")
        codes, offered, took = asyncio.run(overload(url, 10 * sustainable, args.seconds,
                                                    args.max_tokens, args.timeout))
        print(f"overload: offered {offered:.1f} req/s for {args.seconds:.0f} s, all answered "
              f"after {took:.1f} s: {dict(codes)}")
        print(f"server peak RSS: {peak_rss_mib(proc.pid):.0f} MiB")
        health = httpx.get(f"{url}/health", timeout=30).status_code
        after = asyncio.run(one(url, args.max_tokens, args.timeout))
        print(f"afterwards: /health {health}, one more request {after}")
        bad = {k: v for k, v in codes.items() if k not in ("200", "429", "503")}
        if health != 200 or after != "200":
            bad["unhealthy afterwards"] = 1
        print("OK: every request completed or was refused, healthy afterwards" if not bad
              else f"FAILED: {bad}")
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)


if __name__ == "__main__":
    main()
