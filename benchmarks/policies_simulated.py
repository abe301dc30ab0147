"""The scheduling policies at paper scale, in virtual time: ``lenserve simulate`` on the
roofline cost model of an A100-80GB serving Llama-2-7B (every number an estimate), ShareGPT,
Poisson arrivals, seed 0, a KV pool of 1,536 blocks of 16 tokens, from light load to overload.

    python3 benchmarks/policies_simulated.py [--quick] [--dataset-path FILE]

Three ``lenserve simulate`` runs: the policies that use no length (``oracle`` knows the true
one itself); the predictor-driven policies given the true lengths (``--predictor oracle``),
so the table measures mechanisms, not prediction error; and ``alise`` with the embedded
predictor, labelled ``alise (embedded)``.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

if __package__ in (None, ""):       # run as a script: the repository root holds benchmarks/
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import figures, output, runs, stamp, tables

NAME = "policies_simulated"
UNPREDICTED = ("vllm", "vllm-v0", "orca", "static", "sarathi", "fastserve", "fluidinfer", "oracle")
PREDICTED = ("ssjf", "ltr", "alise", "alise-lb", "alise-fluid", "econoserve")
EMBEDDED = "alise (embedded)"
FULL = {"num_prompts": 1000, "rates": [4, 6, 8, 10, 12, 16], "embedded": True}
QUICK = {"num_prompts": 16, "rates": [4, 16], "embedded": False}
# Normalized-latency SLOs (s/token): about 1.6x, 3.2x and 6.4x the unloaded value (0.0157).
SLOS = [0.025, 0.05, 0.1]
NUM_GPU_BLOCKS = 1536     # 12 GiB of Llama-2-7B KV, EconoServe's size: ~57 mean requests


def simulate_args(params: dict, dataset: Path, policies: tuple[str, ...], predictor: str,
                  jct_slo: str, result: Path) -> list[str]:
    return ["simulate", "--hardware", "a100-80g", "--model-shape", "llama-2-7b",
            "--backends", ",".join(f"sim:{p}" for p in policies), "--predictor", predictor,
            "--dataset-name", "sharegpt", "--dataset-path", str(dataset),
            "--num-prompts", str(params["num_prompts"]),
            "--num-gpu-blocks", str(NUM_GPU_BLOCKS),
            "--sweep-rates", ",".join(str(r) for r in params["rates"]), "--seed", "0",
            "--jct-slo", jct_slo, "--disable-tqdm", "--result-json", output.rel(result),
            "--plot", output.rel(result.with_suffix(".png"))]


def jct_slo_of(result: Path) -> str:
    """EconoServe's JCT SLO with tp and tg of the first run's lightest load (vllm's), so
    every policy is judged against the same one."""
    first = json.loads(result.read_text())["runs"]
    s = min(first, key=lambda r: r["request_rate"])["summary"]["jct_slo"]
    return f"{s['scale']:g}:{s['tp_ms']:.3f}:{s['tg_ms']:.3f}"


def run_all(params: dict, dataset: Path, raw: Path) -> tuple[list[dict], list[str]]:
    """The simulate runs; their reduced runs and the commands as pasted."""
    plan = [("mechanisms", UNPREDICTED, "none", {}),
            ("true_lengths", PREDICTED, "oracle", {}),
            *([("embedded", ("alise",), "embedded", {"alise": EMBEDDED})]
              if params["embedded"] else [])]
    found, commands, slo = [], [], "2"
    for label, policies, predictor, rename in plan:
        result = raw / f"{label}.json"
        args = simulate_args(params, dataset, policies, predictor, slo, result)
        runs.lenserve(args, raw / f"{label}.log")
        commands.append(runs.shown(args))
        slo = jct_slo_of(result) if label == "mechanisms" else slo
        found += runs.load_runs(result, rename)
    order = {p: i for i, p in enumerate((*UNPREDICTED[:-1], *PREDICTED, "oracle", EMBEDDED))}
    return sorted(found, key=lambda r: (order.get(r["policy"], 99), r["request_rate"])), commands


def describe_rate(rate: float, note: str) -> str:
    return {">=": f"at least {rate:g} req/s (every tested rate)",
            "<": f"under {rate:g} req/s (no tested rate)"}.get(note, f"{rate:.2f} req/s")


def summary_text(found: list[dict], params: dict) -> str:
    slo = SLOS[1]
    named = [p for p in ("vllm", "oracle", EMBEDDED) if p in tables.policies(found)]
    rates = "; ".join(
        f"{p} {describe_rate(*tables.sustained_rate(tables.nl_points(found, p), slo))}"
        for p in named)
    embedded = ""
    pred = next((r["predictions"] for r in found if r["policy"] == EMBEDDED and r["predictions"]),
                None)
    if pred:
        embedded = (f" `{EMBEDDED}` is `alise` on the embedded predictor's own predictions "
                    f"(median relative error {pred['median_abs_rel_error']:.2f} at the lowest "
                    f"rate).")
    return (f"**Every number here is an estimate**: the real serving core and policy objects "
            f"run on the roofline cost model of an A100-80GB serving Llama-2-7B "
            f"(`lenserve simulate`), {params['num_prompts']:,} ShareGPT requests per rate, "
            f"Poisson arrivals, seed 0, a KV pool of {NUM_GPU_BLOCKS:,} blocks of 16 tokens. "
            f"{_listed(PREDICTED)} are given the true output lengths, so "
            f"`alise` matches `oracle` and the table compares mechanisms without prediction "
            f"error. There is no host KV tier, so `fluidinfer` (whose resident set cycles "
            f"through one) runs as `vllm` does.{embedded} Highest rate under normalized latency {slo:g} s/token: {rates}; "
            f"the baseline is `vllm` (FCFS with chunked prefill).")


def _listed(names: tuple[str, ...]) -> str:
    quoted = [f"`{n}`" for n in names]
    return ", ".join(quoted[:-1]) + " and " + quoted[-1]


def plot(path: Path, found: list[dict]) -> None:
    figures.nl_vs_rate(path, found, "Normalized latency vs rate, A100-80GB + Llama-2-7B "
                       "(simulated)", log_y=True)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = output.parser(__doc__, dataset="ShareGPT file (default: %(default)s)",
                       dataset_default=runs.SHAREGPT)
    args = ap.parse_args(argv)
    dataset = runs.dataset_file(args.dataset_path)
    out, params = output.outputs(args, NAME), QUICK if args.quick else FULL
    start, t0 = stamp.take(), time.perf_counter()
    found, commands = run_all(params, dataset, out.raw)
    plot(out.file(NAME, "png"), found)
    section = output.Section(
        title="Policies at paper scale (simulated, estimates)",
        text=summary_text(found, params),
        tables=[("Normalized latency (s/token)",
                 tables.rate_table(found, lambda s: s[tables.NL], "{:.4f}")),
                ("Highest rate under a normalized-latency SLO (interpolated; `>=`: met at "
                 "every tested rate, `<`: at none)", tables.sustained_table(found, SLOS))],
        figure_alt="normalized latency vs request rate per policy, simulated")
    output.publish(out, NAME, section, argv=argv, commands=commands,
                   stamp=stamp.finish(start, time.perf_counter() - t0),
                   data={"params": {**params, "num_gpu_blocks": NUM_GPU_BLOCKS, "slos": SLOS,
                                    "dataset": output.rel(dataset)}, "runs": found})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
