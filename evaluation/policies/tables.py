"""Tables and the figure of a policy sweep: simulated (``evaluation/policies/sweep.sh``) or real
(``lenserve bench`` with ``lenserve:<policy>`` backends and ``--sweep-rates``).

    python3 -m evaluation.policies.tables RAW_DIR LABEL --out results/policies [--slo 0.05 0.1]

RAW_DIR holds ``lenserve simulate`` or ``lenserve bench`` result JSONs (one per policy, or one
with every policy). Writes LABEL.summary.json (each
run's summary plus prediction statistics, without per-request records), LABEL.png (normalized
latency vs rate) and LABEL.md (the tables), and prints the tables. Every figure comes from the
summaries ``lenserve simulate`` / ``bench`` computed (``lenserve/bench/metrics.py``); what is derived here
is the sustained rate (interpolated where normalized latency crosses the SLO) and the
prediction error (predicted vs forced output length per request).
"""
from __future__ import annotations

import argparse
import itertools
import json
import math
from pathlib import Path

import numpy as np

from lenserve.bench.report import plot_normalized_latency

ORDER = ("vllm", "orca", "sarathi", "fastserve", "fluidinfer", "alise-fluid", "ssjf", "ltr",
         "alise", "oracle", "econoserve")
NL = "normalized_latency_s_per_token"


def load_runs(raw: Path) -> list[dict]:
    """Every run of every JSON under ``raw``, per-request records reduced to statistics."""
    runs = []
    for path in sorted(raw.glob("*.json")):
        for run in json.loads(path.read_text())["runs"]:
            requests = run.pop("requests")
            run.pop("profile", None)
            run["predictions"] = prediction_stats(requests)
            run["policy"] = run["backend"].removeprefix("sim:").removeprefix("lenserve:")
            runs.append(run)
    rank = {p: i for i, p in enumerate(ORDER)}
    return sorted(runs, key=lambda r: (rank.get(r["policy"], 99), r["request_rate"]))


def prediction_stats(requests: list[dict]) -> dict | None:
    """Error of the predicted length against the true (forced) one, over successful requests
    that had a prediction."""
    pairs = [(r["predicted_len"], r["output_len"], r["prediction_source"]) for r in requests
             if r.get("predicted_len") and r.get("error") is None]
    if not pairs:
        return None
    pred = np.array([p for p, _, _ in pairs], dtype=float)
    true = np.array([t for _, t, _ in pairs], dtype=float)
    rel = np.abs(pred - true) / true
    sources: dict[str, int] = {}
    for _, _, src in pairs:
        sources[src] = sources.get(src, 0) + 1
    return {"count": len(pairs), "mean_abs_rel_error": float(rel.mean()),
            "median_abs_rel_error": float(np.median(rel)),
            "within_50pct": float(np.mean(rel <= 0.5)),
            "spearman": spearman(pred, true), "sources": sources}


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    ra, rb = _ranks(a), _ranks(b)
    return float(np.corrcoef(ra, rb)[0, 1]) if len(a) > 1 else math.nan


def _ranks(x: np.ndarray) -> np.ndarray:
    order = np.argsort(x, kind="stable")
    ranks = np.empty(len(x))
    ranks[order] = np.arange(len(x))
    for value in np.unique(x):            # ties share their mean rank
        tied = x == value
        ranks[tied] = ranks[tied].mean()
    return ranks


def sustained_rate(points: list[tuple[float, float]], limit: float) -> tuple[float, str]:
    """Highest rate under ``limit``: linear between the last tested rate that meets it (all
    lower ones too) and the first that does not. The note says when it lies outside the
    tested range."""
    points = sorted(points)
    if not points or not points[0][1] <= limit:
        return (points[0][0] if points else math.nan), "<"
    for (r0, v0), (r1, v1) in itertools.pairwise(points):
        if not v1 <= limit:
            return r0 + (r1 - r0) * (limit - v0) / (v1 - v0), ""
    return points[-1][0], ">="


def by_policy(runs: list[dict], key) -> dict[str, list[tuple[float, float]]]:
    table: dict[str, list[tuple[float, float]]] = {}
    for run in runs:
        table.setdefault(run["policy"], []).append((run["request_rate"], key(run["summary"])))
    return table


def rate_table(runs: list[dict], key, fmt: str) -> list[str]:
    policies = list(dict.fromkeys(r["policy"] for r in runs))
    rates = sorted({r["request_rate"] for r in runs})
    cell = {(r["policy"], r["request_rate"]): key(r["summary"]) for r in runs}
    lines = ["| rate (req/s) | " + " | ".join(policies) + " |",
             "| --- |" + " --- |" * len(policies)]
    for rate in rates:
        values = [cell.get((p, rate)) for p in policies]
        lines.append(f"| {rate:g} | " + " | ".join("-" if v is None else fmt.format(v)
                                                   for v in values) + " |")
    return lines


def sustained_table(runs: list[dict], key, limits: list[float], what: str) -> list[str]:
    points = by_policy(runs, key)
    head = "| policy | " + " | ".join(f"{what} <= {x:g}: rate | x vllm | x oracle" for x in limits)
    lines = [head + " |", "| --- |" + " --- | --- | --- |" * len(limits)]
    for policy, pts in points.items():
        cells = []
        for x in limits:
            rate, note = sustained_rate(pts, x)
            base = {p: sustained_rate(points[p], x)[0] for p in ("vllm", "oracle") if p in points}
            cells += [f"{note}{rate:.2f}",
                      *(f"{rate / base[p]:.2f}" if base.get(p) else "-" for p in ("vllm", "oracle"))]
        lines.append(f"| {policy} | " + " | ".join(cells) + " |")
    return lines


def joint_table(runs: list[dict], pairs: list[tuple[float, float]]) -> list[str]:
    """Highest rate that keeps a normalized-latency SLO and a P99 latency bound at once: the
    lower of the two sustained rates (each taken up to the first rate that breaks it)."""
    nl = by_policy(runs, lambda x: x[NL])
    lb = by_policy(runs, lambda x: x["latency_bound_ms"]["p99"] / 1e3)

    def rate(policy: str, slo: float, bound: float) -> tuple[float, str]:
        both = [sustained_rate(nl[policy], slo), sustained_rate(lb[policy], bound)]
        if any(note == "<" for _, note in both):
            return min(r for r, _ in both), "<"
        return min(both)        # at a tie, "" (crossed there) sorts before ">=" (not crossed)

    head = "| policy | " + " | ".join(f"NL <= {x:g} and P99 LB <= {y:g} s: rate | x vllm"
                                      for x, y in pairs)
    lines = [head + " |", "| --- |" + " --- | --- |" * len(pairs)]
    for policy in nl:
        cells = []
        for x, y in pairs:
            r, note = rate(policy, x, y)
            base = rate("vllm", x, y)[0] if "vllm" in nl else math.nan
            cells += [f"{note}{r:.2f}", f"{r / base:.2f}" if base > 0 else "-"]
        lines.append(f"| {policy} | " + " | ".join(cells) + " |")
    return lines


def throughput_at_bound(points: list[tuple[float, float, float]], bound: float) -> float:
    """Highest measured output throughput among the runs that keep the P99 latency bound,
    taking rates in order up to the first that breaks it (as ``sustained_rate``); NaN if the
    lowest rate already breaks it. ``points`` are (rate, P99 bound s, tok/s)."""
    best = math.nan
    for _, lb, tput in sorted(points):
        if not lb <= bound:
            break
        best = tput if math.isnan(best) else max(best, tput)
    return best


def throughput_bound_table(runs: list[dict], bounds: list[float]) -> list[str]:
    """The paper-002 comparison: output tokens/s each policy delivers while keeping every
    request's longest token gap (P99 over requests) under a bound."""
    points: dict[str, list[tuple[float, float, float]]] = {}
    for run in runs:
        s = run["summary"]
        points.setdefault(run["policy"], []).append(
            (run["request_rate"], s["latency_bound_ms"]["p99"] / 1e3, s["output_throughput"]))
    head = "| policy | " + " | ".join(f"P99 LB <= {b:g} s: tok/s | x vllm" for b in bounds)
    lines = [head + " |", "| --- |" + " --- | --- |" * len(bounds)]
    bases = [throughput_at_bound(points["vllm"], b) if "vllm" in points else math.nan
             for b in bounds]
    for policy, pts in points.items():
        cells = []
        for b, base in zip(bounds, bases):
            tput = throughput_at_bound(pts, b)
            cells += ["-" if math.isnan(tput) else f"{tput:.0f}",
                      f"{tput / base:.2f}" if base > 0 and not math.isnan(tput) else "-"]
        lines.append(f"| {policy} | " + " | ".join(cells) + " |")
    return lines


def prediction_table(runs: list[dict]) -> list[str]:
    lines = [("| policy | rate | predicted | mean abs rel error | median | within 50% | Spearman "
             "| sources |"), "| --- |" + " --- |" * 7]
    for run in runs:
        p = run["predictions"]
        if p is None or run["policy"] == "oracle":
            continue
        lines.append(f"| {run['policy']} | {run['request_rate']:g} | {p['count']} | "
                     f"{p['mean_abs_rel_error']:.2f} | {p['median_abs_rel_error']:.2f} | "
                     f"{p['within_50pct']:.0%} | {p['spearman']:.2f} | "
                     + ", ".join(f"{k} {v}" for k, v in sorted(p["sources"].items())) + " |")
    return lines


def report(runs: list[dict], label: str, slos: list[float], bounds: list[float],
           joint: list[tuple[float, float]] = ()) -> str:
    s = runs[0]["summary"].get("jct_slo") or {}
    sections = [
        (f"Normalized latency (s/token), {label}", rate_table(runs, lambda x: x[NL], "{:.4f}")),
        ("Highest rate under a normalized-latency SLO (s/token)",
         sustained_table(runs, lambda x: x[NL], slos, "NL")),
        ("Highest rate under a P99 latency bound (s)",
         sustained_table(runs, lambda x: x["latency_bound_ms"]["p99"] / 1e3, bounds, "P99 LB")),
        ("Highest output throughput under a P99 latency bound (tok/s)",
         throughput_bound_table(runs, bounds)),
        *([("Highest rate under a normalized-latency SLO and a P99 latency bound at once",
            joint_table(runs, list(joint)))] if joint else []),
        ("Mean JCT (s)", rate_table(runs, lambda x: x["jct_ms"]["mean"] / 1e3, "{:.2f}")),
        ((f"SLO satisfaction ratio, JCT SLO {s.get('scale', '?')} x (tp + tg x l), tp "
         f"{s.get('tp_ms', math.nan):.1f} ms, tg {s.get('tg_ms', math.nan):.2f} ms"),
         rate_table(runs, lambda x: x.get("slo_satisfaction_ratio", math.nan), "{:.1%}")),
        ("Output throughput (tok/s)", rate_table(runs, lambda x: x["output_throughput"], "{:.0f}")),
        ("Preemptions (recompute)", rate_table(runs, lambda x: x.get("num_preemptions", math.nan),
                                               "{:.0f}")),
        ("Prediction error (predicted vs true output length)", prediction_table(runs)),
    ]
    return "\n\n".join(f"#### {title}\n\n" + "\n".join(lines) for title, lines in sections) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("raw", type=Path, help="directory of lenserve simulate / bench result JSONs")
    ap.add_argument("label", help="name of the outputs, e.g. sharegpt_llama-2-7b")
    ap.add_argument("--out", type=Path, default=Path("results/policies"))
    ap.add_argument("--title", help="figure title")
    ap.add_argument("--slo", type=float, nargs="+", default=[0.05, 0.1],
                    help="normalized-latency SLOs (s/token)")
    ap.add_argument("--latency-bound", type=float, nargs="+", default=[0.5, 1.0],
                    help="P99 latency bounds (s)")
    ap.add_argument("--joint", nargs="+", default=[], metavar="NL:LB",
                    help="pairs of an NL SLO (s/token) and a P99 latency bound (s) kept at once")
    args = ap.parse_args()
    try:
        joint = [tuple(float(v) for v in pair.split(":", 1)) for pair in args.joint]
    except ValueError:
        raise SystemExit(f"--joint takes NL:LB pairs such as 0.05:1, got {args.joint}") from None
    if any(len(pair) != 2 for pair in joint):
        raise SystemExit(f"--joint takes NL:LB pairs such as 0.05:1, got {args.joint}")
    runs = load_runs(args.raw)
    if not runs:
        raise SystemExit(f"no result JSON under {args.raw}")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.label}.summary.json").write_text(json.dumps(runs, indent=1))
    results = [{"backend": r["policy"], "request_rate": r["request_rate"],
                "summary": r["summary"]} for r in runs]
    plot_normalized_latency(args.out / f"{args.label}.png", results, args.title or args.label,
                            log_y=True, dpi=80)
    text = report(runs, args.label, args.slo, args.latency_bound, joint)
    (args.out / f"{args.label}.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
