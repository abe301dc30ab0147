"""Inputs and checks the benchmark tests share: tiny datasets, a run's summary, a stamp."""
from __future__ import annotations

import gzip
import json
import threading
from pathlib import Path

from benchmarks import stamp

_ONE_AT_A_TIME = threading.Lock()


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
    log) instead of a new interpreter per command: a quick benchmark's commands then pay their
    imports (torch, the embedding model) once. Commands a benchmark runs on several threads
    take turns (stdout is redirected process-wide)."""
    import contextlib
    import os
    import time

    from benchmarks import runs
    from lenserve import cli

    def run(args: list[str], log: Path) -> float:
        log.parent.mkdir(parents=True, exist_ok=True)
        t0, here = time.perf_counter(), os.getcwd()
        with _ONE_AT_A_TIME, open(log, "w") as out, contextlib.redirect_stdout(out), \
                contextlib.redirect_stderr(out):
            os.chdir(runs.REPO)     # result paths are relative to the checkout, as when pasted
            try:
                code = cli.main(list(args))
            except SystemExit as exit_:
                code = exit_.code if isinstance(exit_.code, int) else 1
            finally:
                os.chdir(here)
        if code != 0:
            raise runs.CommandFailed(f"{runs.shown(args)} failed (exit {code}); see {log}")
        return time.perf_counter() - t0

    monkeypatch.setattr(runs, "lenserve", run)
