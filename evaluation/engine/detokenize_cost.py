"""Share of an engine step spent in update/output building, with and without detokenizing.

    python3 -m evaluation.engine.detokenize_cost [--model opt-tiny] [--requests 256] [--runs 2]

Runs the same greedy requests (forced lengths) through ``LLMEngine`` with
``SamplingParams(detokenize=True)`` and ``False``, alternating, and prints each run's step
profile: the ``update`` share is the scheduler's update plus output building.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run by path: the checkout

from lenserve.engine.llm_engine import EngineConfig, LLMEngine
from lenserve_contract.sampling_params import SamplingParams


def run(model: str, requests: int, detokenize: bool) -> str:
    engine = LLMEngine(EngineConfig(model=model, num_gpu_blocks=4096, max_num_seqs=requests))
    for i in range(requests):
        engine.add_request(f"r{i}", prompt_token_ids=[1000 + i % 50] * 20,
                           sampling_params=SamplingParams(max_tokens=64, ignore_eos=True,
                                                          temperature=0.0,
                                                          detokenize=detokenize))
    start = time.perf_counter()
    while engine.has_unfinished_requests():
        engine.step()
    return f"detokenize={detokenize}: {time.perf_counter() - start:.1f}s, {engine.profile.summary()}"


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="opt-tiny")
    p.add_argument("--requests", type=int, default=256)
    p.add_argument("--runs", type=int, default=2)
    args = p.parse_args()
    for _ in range(args.runs):
        for detokenize in (True, False):
            print(run(args.model, args.requests, detokenize), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
