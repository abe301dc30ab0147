"""Fault demo of the service split, on `lenserve up`:

1. undecodable protobuf bytes to each service -> INVALID_ARGUMENT, and no traceback in the logs;
2. kill -9 of the executor under load -> in-flight requests end with a clear error, and
   requests sent after the executor is restarted succeed.

    python3 -m evaluation.services.fault_demo --model opt-tiny [--requests 12]
"""
from __future__ import annotations

import argparse
import asyncio
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import grpc

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from lenserve.client import AsyncClient, SamplingParams  # noqa: E402
from services.rpc import check_health  # noqa: E402

METHODS = {"scheduler": "/lenserve.proto.SchedulerService/Generate",
           "executor": "/lenserve.proto.ExecutorService/Execute",
           "predictor": "/lenserve.proto.PredictorService/Predict"}


def start_up(model: str, log_path: Path) -> tuple[subprocess.Popen, dict]:
    log = open(log_path, "w")
    proc = subprocess.Popen([sys.executable, "-m", "lenserve.cli", "up", "--model", model],
                            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    deadline = time.monotonic() + 600
    while "ready" not in log_path.read_text():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"lenserve up failed:\n{log_path.read_text()}")
        time.sleep(0.5)
    found = re.findall(r"^(\w+)\s+grpc://(\S+)\s+\(pid (\d+)\)", log_path.read_text(), re.M)
    return proc, {name: (target, int(pid)) for name, target, pid in found}


def malformed(services: dict) -> None:
    for name, method in METHODS.items():
        with grpc.insecure_channel(services[name][0]) as channel:
            stream = name == "scheduler"
            call = (channel.unary_stream if stream else channel.unary_unary)(method)
            try:
                result = call(b"\xff\xff\xff\xff", timeout=10)
                list(result) if stream else None
                print(f"  {name:<10} answered OK (unexpected)")
            except grpc.RpcError as err:
                print(f"  {name:<10} {err.code().name}: {err.details()}")


async def one(client, i: int, max_tokens: int):
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0)
    n, last = 0, None
    async for out in client.generate(f"request {i}", params):
        n, last = n + len(out.outputs[0].token_ids), out
    return n, last.outputs[0].finish_reason, last.error


async def under_load(services: dict, num: int, log_path: Path) -> None:
    target, pid = services["scheduler"][0], services["executor"][1]
    async with AsyncClient(target) as client:
        tasks = [asyncio.create_task(one(client, i, 2000)) for i in range(num)]
        await asyncio.sleep(3.0)
        stats = await client.stats()
        print(f"  {stats.num_running} running, {stats.num_waiting} waiting; kill -9 executor "
              f"(pid {pid})")
        os.kill(pid, signal.SIGKILL)
        results = await asyncio.gather(*tasks)
        print(f"  in-flight: {Counter(r[1] for r in results)}; tokens before the kill: "
              f"{sorted(r[0] for r in results)}")
        print(f"  error: {next((r[2] for r in results if r[2]), None)}")
        while "executor restarted" not in log_path.read_text() or \
                not check_health(services["executor"][0]):
            await asyncio.sleep(0.2)
        t0 = time.monotonic()
        after = await asyncio.gather(*(one(client, 100 + i, 16) for i in range(4)))
        print(f"  after restart: {Counter(r[1] for r in after)} "
              f"({time.monotonic() - t0:.1f} s for 4 requests)")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="opt-tiny")
    ap.add_argument("--requests", type=int, default=12)
    args = ap.parse_args()
    log_path = Path(tempfile.mkdtemp()) / "up.log"
    proc, services = start_up(args.model, log_path)
    try:
        print("malformed protobuf bytes:")
        malformed(services)
        print(f"kill -9 under load ({args.requests} streams):")
        asyncio.run(under_load(services, args.requests, log_path))
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
    text = log_path.read_text()
    print(f"service logs ({log_path}): {text.count('Traceback')} tracebacks; "
          f"lines about the malformed calls: {text.count('malformed')}")
    print("".join(f"  | {line}\n" for line in text.splitlines() if "lenserve up:" in line))
    return 0


if __name__ == "__main__":
    sys.exit(main())
