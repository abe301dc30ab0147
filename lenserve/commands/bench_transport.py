"""``lenserve bench-transport``: per-iteration cost of the service split. The same workload
runs on an engine whose executor is in-process and on one whose executor is a separate
``python -m services.executor`` process behind gRPC; the difference per step is the
transport's overhead (serialisation, the loopback round trip, the server's thread hop).

The difference between two runs also carries the machine's noise in the forward itself, which
on a busy CPU is larger than the transport. So each ``Execute`` call is also timed against the
time the executor reports for its own iteration (``IterationTimings.total_s``): what is left
is the transport alone."""
from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time

from lenserve_contract.sampling_params import SamplingParams


def register(subparsers) -> None:
    p = subparsers.add_parser("bench-transport",
                              help="ms per engine step: executor in-process vs over gRPC")
    p.add_argument("--model", default="fake", help="model preset or path ('fake': no model)")
    p.add_argument("--num-requests", type=int, default=8)
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--num-gpu-blocks", type=int, default=256)
    p.add_argument("--rounds", type=int, default=2, help="alternating rounds of each transport")
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads on both sides (equal, so only the transport differs; "
                        "more threads than free cores makes OpenMP wait on descheduled threads)")
    p.set_defaults(func=run)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_executor(args: argparse.Namespace) -> tuple[subprocess.Popen, str]:
    from services.rpc import check_health

    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "services.executor", "--model", args.model,
                             "--port", str(port), "--num-gpu-blocks", str(args.num_gpu_blocks)],
                            stderr=subprocess.DEVNULL,
                            env={**os.environ, "OMP_NUM_THREADS": str(args.threads)})
    deadline = time.monotonic() + 300
    while not check_health(f"127.0.0.1:{port}"):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("the executor service did not start")
        time.sleep(0.2)
    return proc, f"grpc://127.0.0.1:{port}"


def time_steps(engine, args: argparse.Namespace) -> tuple[float, int, list[int], float]:
    """Seconds of the whole run, steps taken, request 0's tokens (to compare), and the seconds
    the ``Execute`` calls took beyond the executor's own time for its iterations."""
    params = SamplingParams(max_tokens=args.output_len, ignore_eos=True, temperature=0)
    for i in range(args.num_requests):
        engine.add_request(f"r{i}", prompt_token_ids=[(7 * i + j) % 200 + 1
                                                      for j in range(args.prompt_len)],
                           sampling_params=params)
    executor, beyond = engine.executor, [0.0]
    execute = executor.execute

    def timed(batch):
        start = time.perf_counter()
        out = execute(batch)
        beyond[0] += time.perf_counter() - start - out.timings.total_s
        return out

    executor.execute = timed
    steps, tokens, t0 = 0, [], time.perf_counter()
    try:
        while engine.has_unfinished_requests():
            for out in engine.step():
                if out.request_id == "r0" and out.finished:
                    tokens = out.outputs[0].token_ids
            steps += 1
    finally:
        del executor.execute          # the class's method again
    return time.perf_counter() - t0, steps, tokens, beyond[0]


def run(args: argparse.Namespace) -> int:
    import torch

    from lenserve.engine.llm_engine import EngineConfig, LLMEngine
    from services.executor.client import ExecutorClient

    torch.set_num_threads(args.threads)

    config = EngineConfig(model=args.model, num_gpu_blocks=args.num_gpu_blocks)
    local = LLMEngine(config)
    proc, target = start_executor(args)
    try:
        remote = LLMEngine(config, executor=ExecutorClient(target))
        for engine in (local, remote):   # warm-up: first-call costs stay out of the figures
            time_steps(engine, argparse.Namespace(**{**vars(args), "output_len": 2}))
        results: dict[str, list[float]] = {"in-process": [], "grpc": []}
        beyond: dict[str, list[float]] = {"in-process": [], "grpc": []}
        same = True
        for _ in range(args.rounds):
            base = None
            for name, engine in (("in-process", local), ("grpc", remote)):
                secs, steps, tokens, extra = time_steps(engine, args)
                results[name].append(1e3 * secs / steps)
                beyond[name].append(1e3 * extra / steps)
                same &= base is None or tokens == base
                base = tokens
        _report(args, results, beyond, steps, same)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    return 0


def _report(args, results: dict[str, list[float]], beyond: dict[str, list[float]], steps: int,
            same: bool) -> None:
    print(f"model {args.model}: {args.num_requests} requests x {args.prompt_len} prompt + "
          f"{args.output_len} output tokens, {steps} steps per run, {args.threads} torch "
          f"thread(s) each side; ms per step, min-max of {args.rounds} runs")
    for name, ms in results.items():
        print(f"  {name:<10} {min(ms):8.3f} - {max(ms):8.3f}")
    overhead = [g - i for g, i in zip(results["grpc"], results["in-process"])]
    print(f"  overhead   {min(overhead):8.3f} - {max(overhead):8.3f}  (grpc - in-process, "
          f"same round)")
    for name, ms in beyond.items():
        print(f"  {name:<10} {min(ms):8.3f} - {max(ms):8.3f}  per Execute call beyond the "
              f"executor's own iteration time")
    print(f"  tokens identical across transports: {same}")
