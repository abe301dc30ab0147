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


def in_process(monkeypatch) -> None:
    """``benchmarks.runs.lenserve`` in this process (``lenserve.cli.main``, its output into the
    log) instead of a new interpreter per command: a quick benchmark's dozen commands then pay
    their imports and the embedding model's load once. Only for benchmarks that run their
    commands one at a time (stdout is redirected process-wide)."""
    import contextlib
    import os

    from benchmarks import runs
    from lenserve import cli

    def run(args: list[str], log: Path) -> float:
        log.parent.mkdir(parents=True, exist_ok=True)
        here = os.getcwd()
        with open(log, "w") as out, contextlib.redirect_stdout(out), \
                contextlib.redirect_stderr(out):
            os.chdir(runs.REPO)
            try:
                code = cli.main(list(args))
            except SystemExit as exit_:
                code = exit_.code if isinstance(exit_.code, int) else 1
            finally:
                os.chdir(here)
        if code != 0:
            raise runs.CommandFailed(f"{runs.shown(args)} failed (exit {code}); see {log}")
        return 0.0

    monkeypatch.setattr(runs, "lenserve", run)
