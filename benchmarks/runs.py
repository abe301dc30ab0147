"""Running lenserve's own commands for a benchmark, and reading back what they wrote. Every
figure comes from the summaries those commands compute (``lenserve/bench/metrics.py``); what is
derived here is only a selection and reshaping of them."""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks.stamp import REPO

# The public traces sit in a ``shared/data`` folder beside the checkout (benchmarks may read
# them; the product ships what it needs). ``--dataset-path`` names the file elsewhere.
SHAREGPT = REPO.parent / "shared" / "data" / "sharegpt_v3_first_turn.jsonl.gz"


class CommandFailed(RuntimeError):
    pass


def shown(args: list[str]) -> str:
    """The command line as a reader pastes it from the repository root: paths relative to it,
    so the page names no folder of the machine that made it."""
    return "lenserve " + shlex.join(_relative(arg) for arg in args)


def _relative(arg: str) -> str:
    return os.path.relpath(arg, REPO) if os.path.isabs(arg) and os.path.exists(arg) else arg


def lenserve(args: list[str], log: Path) -> float:
    """Run ``lenserve ARGS`` from the repository root, its output into ``log``; the wall
    seconds it took. The checkout comes first on the path, so packages that live only in the
    source tree (``evaluation``) import as they do for ``pip install -e .``."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]))
    log.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with open(log, "w") as out:
        done = subprocess.run([sys.executable, "-m", "lenserve.cli", *args], cwd=REPO, env=env,
                              stdout=out, stderr=subprocess.STDOUT, check=False)
    if done.returncode != 0:
        tail = log.read_text().strip().splitlines()[-5:]
        raise CommandFailed(f"{shown(args)} failed (exit {done.returncode}); last lines of "
                            f"{log}:\n" + "\n".join(tail))
    return time.perf_counter() - t0


def dataset_file(path: str | Path | None, default: Path = SHAREGPT) -> Path:
    """The dataset file to read, with an error that says what to pass when it is absent."""
    file = Path(path) if path is not None else default
    if not file.is_file():
        raise SystemExit(f"dataset file not found: {file}; pass --dataset-path with a ShareGPT "
                         f"file (JSON or JSON lines, optionally gzipped)")
    return file


def load_runs(path: Path, rename: dict[str, str] | None = None) -> list[dict]:
    """The runs of a ``lenserve bench``/``simulate`` result JSON: each run's summary, its
    policy (the backend without ``sim:``/``lenserve:``, renamed by ``rename``) and its
    prediction error, without the per-request records."""
    runs = []
    for run in json.loads(path.read_text())["runs"]:
        policy = run["backend"].split(":", 1)[-1]
        runs.append({"policy": (rename or {}).get(policy, policy),
                     "request_rate": run["request_rate"], "summary": run["summary"],
                     "predictions": prediction_error(run["requests"])})
    return runs


def prediction_error(requests: list[dict]) -> dict | None:
    """Predicted against true (forced) output length over the successful requests that had a
    prediction; None where none had one."""
    pairs = np.array([(r["predicted_len"], r["output_len"]) for r in requests
                      if r.get("predicted_len") and r.get("error") is None and r["output_len"]],
                     dtype=float).reshape(-1, 2)
    if not len(pairs):
        return None
    rel = np.abs(pairs[:, 0] - pairs[:, 1]) / pairs[:, 1]
    return {"count": len(pairs), "median_abs_rel_error": float(np.median(rel)),
            "mean_abs_rel_error": float(rel.mean()), "rank_correlation": _spearman(pairs)}


def _spearman(pairs: np.ndarray) -> float | None:
    """Spearman's rank correlation of predicted and true lengths (what a length-ranked
    scheduler reads from a predictor; ties ranked in order), None below 3 pairs."""
    if len(pairs) < 3:
        return None
    ranks = pairs.argsort(axis=0).argsort(axis=0).astype(float)
    return float(np.corrcoef(ranks[:, 0], ranks[:, 1])[0, 1])
