"""Inputs and checks the benchmark tests share: tiny datasets, a run's summary, a stamp."""
from __future__ import annotations

import gzip
import json
from pathlib import Path

from benchmarks import stamp


def section_count(text: str, name: str) -> int:
    return text.count(f"<!-- BEGIN {name} -->")


def tiny_sharegpt(path: Path, n: int = 16) -> Path:
    with gzip.open(path, "wt") as f:
        for i in range(n):
            f.write(json.dumps({"id": f"r{i}_0", "conversations": [
                {"from": "human", "value": f"question {i} " * (3 + i)},
                {"from": "gpt", "value": "answer word " * (5 + 3 * i)}]}) + "\n")
    return path


def bench_run(policy, rate, nl, pred=None):
    return {"policy": policy, "request_rate": rate, "predictions": pred,
            "summary": {"normalized_latency_s_per_token": nl, "ttft_ms": {"mean": 120.0},
                        "e2el_ms": {"p99": 9000.0}, "output_throughput": 50.0,
                        "total_input_tokens": 300, "total_output_tokens": 1200,
                        "completed": 10}}


def cpu_stamp(others):
    s = stamp.finish(stamp.take(), 60.0)
    return {**s, "machine": {**s["machine"], "other_work_cores": others}}


def tiny_alpaca(path: Path, n: int = 16) -> Path:
    path.write_text(json.dumps([{"instruction": f"task {i} " * (2 + i), "input": "",
                                 "output": "done " * (4 + 2 * i)} for i in range(n)]))
    return path
