"""How much of a predictor-driven policy's gap to ``oracle`` comes from prediction error
(simulated): the policy run on the true lengths with log-normal error of chosen sizes, beside
the same policy on real predictors.

    python3 -m evaluation.policies.prediction_sensitivity --out DIR --sigmas 0.25 0.5 1 \\
        --seeds 0 1 2 --predictors embedded embedded:DB --slo 0.08 0.1 0.12 -- \\
        --model opt-125m --dataset-name alpaca --dataset-path alpaca_data_1k_random_subset.json \\
        --num-prompts 60 --max-model-len 256 --num-gpu-blocks 33 --swap-space 1 --seed 0 \\
        --jct-slo 2:143.7:56.28 --sweep-rates 0.3,0.6,1,1.5,2,3,4,6

Runs ``lenserve simulate`` with the flags after ``--`` (workload, KV pool, rates) once for
``vllm`` and ``oracle``, then ``--policy`` once per predictor: ``oracle:SIGMA:SEED`` for each
sigma and seed (``services/predictor/local.py``: the true length times exp(N(0, SIGMA))) and
each of ``--predictors``. Result JSONs go to DIR (a run already there is reused). Prints, per
predictor, its error on the workload (median relative error and Spearman over every run) and
the policy's sustained rate under each normalized-latency SLO, as a multiple of ``oracle``'s
and of ``vllm``'s; a sigma's row gives the min-max over its seeds.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

from evaluation.policies.tables import NL, prediction_stats, sustained_rate


def simulate(out: Path, name: str, policy: str, predictor: str, flags: list[str]) -> Path:
    path = out / f"{name}.json"
    if not path.exists():
        cmd = ["lenserve", "simulate", *flags, "--backends", f"sim:{policy}",
               "--predictor", predictor, "--disable-tqdm", "--result-json", str(path)]
        print(" ".join(cmd), file=sys.stderr)
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return path


def load(path: Path) -> tuple[list[tuple[float, float]], list[dict]]:
    """(rate, normalized latency) points and per-run prediction statistics of one JSON."""
    runs = json.loads(path.read_text())["runs"]
    points = sorted((r["request_rate"], r["summary"][NL]) for r in runs)
    stats = [s for s in (prediction_stats(r["requests"]) for r in runs) if s is not None]
    return points, stats


def span(values: list[float]) -> str:
    lo, hi = min(values), max(values)
    return f"{lo:.2f}" if abs(hi - lo) < 0.005 else f"{lo:.2f}-{hi:.2f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--policy", default="alise")
    ap.add_argument("--sigmas", type=float, nargs="*", default=[0.25, 0.5, 1.0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--predictors", nargs="*", default=[])
    ap.add_argument("--slo", type=float, nargs="+", default=[0.1])
    ap.add_argument("flags", nargs=argparse.REMAINDER, help="-- then lenserve simulate flags")
    args = ap.parse_args()
    flags = args.flags[1:] if args.flags[:1] == ["--"] else args.flags
    args.out.mkdir(parents=True, exist_ok=True)
    base = {p: load(simulate(args.out, p, p, "oracle" if p == "oracle" else "none", flags))[0]
            for p in ("vllm", "oracle")}
    rows = [(f"oracle:{s:g}", [f"oracle:{s:g}:{seed}" for seed in args.seeds])
            for s in args.sigmas]
    rows += [(p, [p]) for p in args.predictors]
    head = " | ".join(f"NL <= {x:g}: x oracle | x vllm" for x in args.slo)
    print(f"| predictor | median rel. error | Spearman | {head} |")
    print("| --- | --- | --- |" + " --- | --- |" * len(args.slo))
    for label, specs in rows:
        results = []
        for spec in specs:
            name = args.policy + "_" + spec.replace(":", "_").replace("/", "_")
            results.append(load(simulate(args.out, name, args.policy, spec, flags)))
        stats = [s for _, st in results for s in st]
        cells = [f"{np.median([s[key] for s in stats]):.2f}"
                 for key in ("median_abs_rel_error", "spearman")]
        for slo in args.slo:
            mine = [sustained_rate(points, slo) for points, _ in results]
            # "<" or ">=": the SLO was crossed below or above the rates run.
            note = "".join(sorted({n for _, n in mine}))
            cells += [note + span([m / sustained_rate(base[p], slo)[0] for m, _ in mine])
                      for p in ("oracle", "vllm")]
        print(f"| {label} | " + " | ".join(cells) + " |")
    rates = {p: {slo: sustained_rate(base[p], slo) for slo in args.slo} for p in base}
    print("\nsustained rates (req/s): " + "; ".join(
        f"{p} " + " / ".join(f"{note}{r:.2f}" for r, note in rates[p].values()) for p in rates))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
