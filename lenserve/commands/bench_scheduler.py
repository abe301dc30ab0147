"""``lenserve bench-scheduler``: time ``Scheduler.schedule()`` with a deep waiting queue.

No model runs: every sampled token is synthetic, so the figures are the scheduler's own cost
per iteration (plus, reported apart, building the ExecutorInput and folding results back).
Wall time and this thread's CPU time are both reported: on a busy machine the wall-time tail
is the OS scheduler's, and the CPU-time tail is the scheduler code's own."""
from __future__ import annotations

import argparse
import gc
import random
import statistics
import time

from lenserve_contract.sampling_params import SamplingParams
from services.executor.types import ExecutorOutput
from services.scheduler.config import SchedulerConfig
from services.scheduler.request import Request
from services.scheduler.scheduler import Scheduler


def register(subparsers) -> None:
    p = subparsers.add_parser("bench-scheduler", help="time schedule() with many waiting requests")
    p.add_argument("--policy", default="vllm")
    p.add_argument("--num-requests", type=int, default=10_000)
    p.add_argument("--iterations", type=int, default=2000)
    p.add_argument("--num-gpu-blocks", type=int, default=8192)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-num-batched-tokens", type=int, default=2048)
    p.add_argument("--prompt-len", type=int, nargs=2, default=[16, 1024], metavar=("MIN", "MAX"))
    p.add_argument("--output-len", type=int, nargs=2, default=[16, 512], metavar=("MIN", "MAX"))
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=run)


def build(args: argparse.Namespace) -> Scheduler:
    config = SchedulerConfig(
        num_gpu_blocks=args.num_gpu_blocks, block_size=args.block_size,
        max_model_len=min(4096, args.num_gpu_blocks * args.block_size),
        max_num_batched_tokens=args.max_num_batched_tokens, max_num_seqs=args.max_num_seqs,
        policy=args.policy)
    scheduler = Scheduler(config)
    rng = random.Random(args.seed)
    for i in range(args.num_requests):
        n = rng.randint(*args.prompt_len)
        params = SamplingParams(max_tokens=rng.randint(*args.output_len), ignore_eos=True,
                                cap_max_tokens=True)
        scheduler.add_request(Request(f"r{i}", [1] * n, params, arrival_time=0.0))
    return scheduler


def run(args: argparse.Namespace) -> int:
    scheduler = build(args)
    # As a serving process does after start-up: the request objects built above are long-lived,
    # so keep the collector from rescanning them during the timed loop.
    gc.collect()
    gc.freeze()
    timings: dict[str, list[float]] = {"waiting": [], "schedule": [], "schedule_cpu": [],
                                       "to_input": [], "update": []}
    now = 0.0
    for _ in range(args.iterations):
        if not scheduler.has_unfinished_requests():
            break
        timings["waiting"].append(scheduler.stats().num_waiting)
        c0, t0 = time.thread_time(), time.perf_counter()
        out = scheduler.schedule(now)
        t1, c1 = time.perf_counter(), time.thread_time()
        batch = scheduler.make_executor_input(out)
        t2 = time.perf_counter()
        sampled = {s.request_id: 2 for s in batch.sequences if s.sample}
        scheduler.update_from_output(out, ExecutorOutput(out.iteration, sampled), now)
        t3 = time.perf_counter()
        for key, dt in (("schedule", t1 - t0), ("schedule_cpu", c1 - c0), ("to_input", t2 - t1),
                        ("update", t3 - t2)):
            timings[key].append(dt * 1e3)
        now += 0.01
    report(args, scheduler, timings)
    return 0


def report(args, scheduler: Scheduler, timings: dict[str, list[float]]) -> None:
    stats = scheduler.stats()
    waiting = timings.pop("waiting")
    print(f"policy={args.policy} requests={args.num_requests} iterations={len(timings['schedule'])} "
          f"waiting: start={waiting[0]} end={waiting[-1]} min={min(waiting)} "
          f"finished={stats.num_finished} preemptions={stats.num_preemptions}")
    for key, values in timings.items():
        values = sorted(values)
        p99 = values[min(len(values) - 1, int(0.99 * len(values)))]
        print(f"{key:>12} ms/iteration: median={statistics.median(values):.4f} "
              f"p99={p99:.4f} max={values[-1]:.4f}")
