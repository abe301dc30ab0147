"""The simulator's CPU-side costs, measured on the real engine: the scheduler's CPU time per
iteration for each policy, the embedded length predictor's latency per request, and the INT8
codec's rate on this CPU. Writes ``services/simulator/data/overheads.json``, which
``lenserve simulate`` reads (``services/simulator/overheads.py``).

    python3 benchmarks/sim_overheads.py [--quick]

Scheduler: the real ``EngineCore`` and policy (outputs built every iteration, as a serving
engine does) drive the cost-model executor of a V100-32GB with OPT-13B's shape, a KV pool of
400 blocks of 16 tokens and a 16 GiB host tier, over 400 requests of random lengths (16-512
prompt and output tokens, Poisson arrivals past the pool's capacity, so queues build and
swaps happen). Every step's CPU time outside the executor (schedule, KV bookkeeping, update,
outputs) is timed; ``intercept_s + per_seq_s * batch`` is fitted to the median time per
batch size. Predictor: ``predict`` on one prompt at a time, 40 Alpaca prompts after 5 warm-up
calls, median; each repeat its own prompts (none cached). Codec: quantize-and-pack plus
unpack-and-dequantize of 64 bf16 blocks of OPT-125m's shape, device bytes per second, median
of 5. This machine's CPU stands for the
simulated machine's host CPU: the simulator names it an estimate. The machine is shared and
noisy: each figure is the smaller of two runs' medians.
"""
from __future__ import annotations

import json
import random
import statistics
import sys
import time
from pathlib import Path

if __package__ in (None, ""):       # run as a script: the repository root holds benchmarks/
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

from benchmarks import output, stamp
from services.scheduler.policies import POLICIES as REGISTERED  # noqa: E402

NAME = "sim_overheads"
# Every registered policy: one left out runs free in the simulator, ahead of those charged.
POLICIES = tuple(REGISTERED)
FULL = {"requests": 400, "prompts": 40, "repeats": 2}
QUICK = {"requests": 20, "prompts": 2, "repeats": 1}
ALPACA = Path(__file__).resolve().parents[2] / "shared" / "data" / \
    "alpaca_data_1k_random_subset.json"


def measure_scheduler(policy: str, num_requests: int, seed: int = 0) -> dict:
    from lenserve_contract.sampling_params import SamplingParams
    from services.kvmanager.config import KVManagerConfig
    from services.scheduler.engine_core import EngineCore
    from services.scheduler.wiring import EngineConfig, engine_parts
    from services.simulator.executor import SimExecutor, VirtualClock
    from services.simulator.host_tier import SimKVManager
    from services.simulator.target import from_roofline

    target, clock = from_roofline("v100-32g", "opt-13b"), VirtualClock()
    executor = SimExecutor(target.shape, target.cost, clock, num_gpu_blocks=400)
    batch = []
    run = executor.execute_scheduled
    executor.execute_scheduled = lambda it, sched: batch.append(len(sched)) or run(it, sched)
    kv = SimKVManager(KVManagerConfig(16), executor.model_info(), target.link, clock)
    config = EngineConfig(model="opt-13b", policy=policy, num_gpu_blocks=400, block_size=16,
                          max_model_len=2048, swap_space_gib=16)
    engine = EngineCore(**engine_parts(config, executor, kv_manager=kv), tokenizer=None,
                        clock=clock)
    rng, t = random.Random(seed), 0.0
    pending = []
    for i in range(num_requests):
        t += rng.expovariate(3.0)
        pending.append((t, f"r{i}", rng.randint(16, 512), rng.randint(16, 512)))
    samples: dict[int, list[float]] = {}
    try:
        while pending or engine.has_unfinished_requests():
            if not engine.has_unfinished_requests():
                clock.advance_to(pending[0][0])
            while pending and pending[0][0] <= clock.now:
                _, rid, p, o = pending.pop(0)
                engine.add_request(rid, prompt_token_ids=[5] * p, predicted_output_len=o,
                                   sampling_params=SamplingParams(max_tokens=o,
                                                                  ignore_eos=True))
            before, n = engine.profile.step_s - engine.profile.executor_s, len(batch)
            engine.step()
            if len(batch) > n and batch[-1]:
                cpu = engine.profile.step_s - engine.profile.executor_s - before
                samples.setdefault(batch[-1], []).append(cpu)
    finally:
        engine.close()
    return fit(samples)


def fit(samples: dict[int, list[float]]) -> dict:
    """``intercept_s + per_seq_s * batch`` through the median of each batch size."""
    sizes = sorted(samples)
    x = np.array([[1.0, n] for n in sizes])
    y = np.array([statistics.median(samples[n]) for n in sizes])
    w = np.sqrt([len(samples[n]) for n in sizes])
    (a, b), *_ = np.linalg.lstsq(x * w[:, None], y * w, rcond=None)
    steps = sum(len(v) for v in samples.values())
    mean_batch = sum(n * len(v) for n, v in samples.items()) / steps
    return {"intercept_s": max(float(a), 0.0), "per_seq_s": max(float(b), 0.0),
            "steps": steps, "mean_batch": mean_batch}


def measure_predictor(num_prompts: int, repeat: int = 0) -> float:
    """Median seconds of one uncached prompt's prediction. Each repeat takes prompts of its
    own: the encoder's vectors are cached per process by prompt text (``embedder``), so a
    repeat over the same prompts would time cache hits (0.5 ms against 8 ms)."""
    from services.predictor.interface import PredictQuery
    from services.predictor.local import make_predictor
    from lenserve.workloads.datasets import load_samples

    predictor = make_predictor("embedded", "opt-13b")
    first = repeat * (num_prompts + 5)
    prompts = [s.prompt for s in load_samples("alpaca", ALPACA)[first:first + num_prompts + 5]]
    times = []
    for i, text in enumerate(prompts):
        start = time.perf_counter()
        predictor.predict([PredictQuery(text, 512, None)], "opt-13b")
        if i >= 5:
            times.append(time.perf_counter() - start)
    getattr(predictor, "close", lambda: None)()
    return statistics.median(times)


def measure_codec(repeats: int = 5) -> float:
    import torch

    from services.executor.kv_cache import KVCachePool
    pool = KVCachePool(12, 80, 16, 12, 64, torch.bfloat16)
    pool.cache.normal_()
    ids = list(range(64))
    buf = torch.empty(pool.packed_nbytes(64), dtype=torch.uint8)
    rates = []
    for _ in range(repeats + 1):
        start = time.perf_counter()
        pool.export_blocks_int8(ids, out=buf)
        pool.import_blocks_int8(ids, buf)
        rates.append(2 * 64 * pool.block_bytes / (time.perf_counter() - start))
    return statistics.median(rates[1:])


def measure(params: dict) -> dict:
    """Each figure the smaller of ``repeats`` runs (the machine's noise only adds time)."""
    runs = [{p: measure_scheduler(p, params["requests"]) for p in POLICIES}
            for _ in range(params["repeats"])]
    scheduler = {p: min((r[p] for r in runs), key=lambda f: f["intercept_s"] + 16 * f["per_seq_s"])
                 for p in POLICIES}
    latency = min(measure_predictor(params["prompts"], i) for i in range(params["repeats"]))
    codec = max(measure_codec() for _ in range(params["repeats"]))
    return {"scheduler": scheduler, "predictor_latency_s": {"embedded": latency},
            "int8_codec_bytes_per_s": codec}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = output.parser(__doc__)
    ap.add_argument("--out", type=Path, default=None,
                    help="where to write (default: services/simulator/data/overheads.json; "
                         "--quick: results/benchmarks-quick/overheads.json)")
    args = ap.parse_args(argv)
    from services.simulator.overheads import DATA
    path = args.out or (output.QUICK_DOCS / "overheads.json" if args.quick else DATA)
    params = QUICK if args.quick else FULL
    start, t0 = stamp.take(), time.perf_counter()
    data = measure(params)
    done = stamp.finish(start, time.perf_counter() - t0)
    data["meta"] = {"machine": done["machine"]["cpu"], "date": done.get("date", "?"),
                    "commit": done.get("commit", "?"), "command": output.invocation(NAME, argv),
                    "params": params, "stamp": done}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {path}: " + ", ".join(
        f"{p} {1e6 * f['intercept_s']:.0f} us + {1e6 * f['per_seq_s']:.1f} us/seq"
        for p, f in data["scheduler"].items())
          + f"; embedded predictor {1e3 * data['predictor_latency_s']['embedded']:.2f} ms"
          + f"; INT8 codec {data['int8_codec_bytes_per_s'] / 1e9:.2f} GB/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
