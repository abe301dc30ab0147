"""Fidelity of ``lenserve simulate`` against ``lenserve bench`` on one workload.

    python3 -m evaluation.simulator.fidelity REAL.json [REAL2.json ...] SIM.json [--markdown]

REAL.json is a ``lenserve bench --result-json`` of ``lenserve:<policy>`` backends, SIM.json a
``lenserve simulate --result-json`` of the same workload (same dataset, seed, prompts, limits
and rates) with ``sim:<policy>`` backends and the profile taken on the machine of the real run.
Runs are paired by policy and request rate. Prints, per pair, the real and simulated mean E2E
latency, mean TTFT, output throughput and p99 E2E latency with the simulator's relative error,
and whether each is within the tolerance (10% for the means and throughput, 20% for p99).
With several real runs of the workload, real values and errors are given as min-max and a
figure is within tolerance only if it is against every run.
Exits 1 when a pair is missing or the two files describe different workloads.
"""
from __future__ import annotations

import argparse
import json
import sys

METRICS = (  # (label, getter, tolerance)
    ("mean E2E (s)", lambda s: s["e2el_ms"]["mean"] / 1000, 0.10),
    ("mean TTFT (s)", lambda s: s["ttft_ms"]["mean"] / 1000, 0.10),
    ("output tok/s", lambda s: s["output_throughput"], 0.10),
    ("p99 E2E (s)", lambda s: s["e2el_ms"]["p99"] / 1000, 0.20),
)
SAME = ("completed", "total_input_tokens", "total_output_tokens")


def load(path: str) -> dict[tuple[str, float], dict]:
    """(policy, rate) -> summary of each run in a result file (records are not read)."""
    with open(path) as f:
        data = json.load(f)
    out = {}
    for run in data["runs"]:
        policy = run["backend"].split(":", 1)[1]
        out[(policy, float(run["request_rate"]))] = run["summary"]
    return out


def compare(reals: list[dict], sim: dict) -> tuple[list[dict], list[str]]:
    rows, problems = [], []
    for key in sorted(reals[0], key=lambda k: (k[0], k[1])):
        if key not in sim:
            problems.append(f"no simulated run for {key[0]} at {key[1]:g} req/s")
            continue
        if any(key not in real for real in reals[1:]):
            problems.append(f"not every real file has {key[0]} at {key[1]:g} req/s")
            continue
        s = sim[key]
        for r in (real[key] for real in reals):
            for field in SAME:
                if r.get(field) != s.get(field):
                    problems.append(f"{key[0]} at {key[1]:g} req/s: {field} differs "
                                    f"(real {r.get(field)}, simulated {s.get(field)}): "
                                    "not the same workload")
        for label, get, tol in METRICS:
            rv = [get(real[key]) for real in reals]
            sv = get(s)
            errs = [(sv - v) / v if v else float("nan") for v in rv]
            rows.append({"policy": key[0], "rate": key[1], "metric": label, "real": rv,
                         "sim": sv, "error": errs, "tolerance": tol,
                         "ok": all(abs(e) <= tol for e in errs)})
    return rows, problems


def _span(values: list[float], fmt: str) -> str:
    lo, hi = min(values), max(values)
    return format(lo, fmt) if lo == hi else f"{format(lo, fmt)} to {format(hi, fmt)}"


def render(rows: list[dict], markdown: bool) -> str:
    head = ["policy", "req/s", "metric", "real", "simulated", "error", "within"]
    lines = []
    for row in rows:
        lines.append([row["policy"], f"{row['rate']:g}", row["metric"], _span(row["real"], ".3g"),
                      f"{row['sim']:.3g}", _span(row["error"], "+.1%"),
                      ("yes" if row["ok"] else "NO") + f" ({row['tolerance']:.0%})"])
    if markdown:
        out = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
        out += ["| " + " | ".join(line) + " |" for line in lines]
        return "\n".join(out)
    widths = [max(len(str(x)) for x in col) for col in zip(head, *lines)]
    return "\n".join("  ".join(str(x).ljust(w) for x, w in zip(line, widths))
                     for line in [head, *lines])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("real", nargs="+", help="real result files, then the simulated one")
    p.add_argument("--markdown", action="store_true")
    args = p.parse_args(argv)
    if len(args.real) < 2:
        p.error("give at least one real and one simulated result file")
    *reals, sim = args.real
    rows, problems = compare([load(path) for path in reals], load(sim))
    print(render(rows, args.markdown))
    within = sum(r["ok"] for r in rows)
    print(f"\n{within} of {len(rows)} figures within tolerance")
    for problem in problems:
        print("error:", problem, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
