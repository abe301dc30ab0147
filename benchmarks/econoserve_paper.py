"""EconoServe at its paper's setting, in virtual time: ``lenserve simulate`` on the roofline
cost model of an A100-80GB serving OPT-13B with a 12 GiB KV budget (491 blocks of 32 tokens,
about 15.7k tokens) and the paper's baselines on the same engine: ``vllm-v0`` (the vLLM the
paper ran), ``vllm`` (V1), ``sarathi``, and ``oracle``. ShareGPT and Alpaca, Poisson arrivals,
seed 0, every policy given the true output lengths (``--predictor oracle``; the paper used a
fine-tuned OPT-13B predictor), EconoServe's JCT SLO at scale 2.

    python3 benchmarks/econoserve_paper.py [--quick] [--dataset-path FILE] [--alpaca-path FILE]

Per dataset one ``lenserve simulate`` sweep of every policy. Reported: the highest rate each
policy sustains under normalized-latency targets and under an SSR target, its ratio to
``vllm-v0`` and ``sarathi`` (the paper's comparisons), and at each rate JCT, SSR, KV
utilisation, scheduler time and the longest wait of any request for its first token. Then the
real engine checks the ranking (``--skip-real`` leaves it out): ``policies_cpu``'s setting
(opt-125m on this CPU, a KV pool of about 7 mean requests, a 1 GiB host tier), ``vllm``,
``vllm-v0``, ``sarathi`` and ``econoserve`` (embedded predictor), two sweeps.
"""
from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

if __package__ in (None, ""):       # run as a script: the repository root holds benchmarks/
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import figures, output, runs, stamp, tables

NAME = "econoserve_paper"
POLICIES = ("vllm-v0", "vllm", "sarathi", "econoserve", "oracle")
ALPACA = runs.SHAREGPT.parent / "alpaca_data_1k_random_subset.json"
NUM_GPU_BLOCKS, BLOCK_SIZE = 491, 32     # 12 GiB of OPT-13B KV (800 KiB per token)
FULL = {"num_prompts": 2000, "rates": {"sharegpt": [1, 2, 2.5, 3, 3.5, 4, 6],
                                       "alpaca": [16, 32, 64, 96, 128, 160, 192]}}
QUICK = {"num_prompts": 16, "rates": {"sharegpt": [2, 8], "alpaca": [8, 32]}}
REAL_POLICIES = ["vllm", "vllm-v0", "sarathi", "econoserve"]
# policies_cpu's pool and model, at its lightest rate and past overload, fewer prompts: on a
# shared 2-core machine each policy's run takes minutes.
REAL = {"num_prompts": 30, "rates": [2.0, 8.0]}
NL_SLOS = [0.05, 0.1]     # s/token: about 2x and 4x the unloaded normalized latency (0.025)
SSR_TARGET = 0.9


def simulate_args(params: dict, dataset: str, path: Path, result: Path) -> list[str]:
    return ["simulate", "--hardware", "a100-80g", "--model-shape", "opt-13b",
            "--block-size", str(BLOCK_SIZE), "--num-gpu-blocks", str(NUM_GPU_BLOCKS),
            "--backends", ",".join(f"sim:{p}" for p in POLICIES), "--predictor", "oracle",
            "--dataset-name", dataset, "--dataset-path", str(path), "--repeat-dataset",
            "--num-prompts", str(params["num_prompts"]),
            "--sweep-rates", ",".join(f"{r:g}" for r in params["rates"][dataset]),
            "--seed", "0", "--jct-slo", "2", "--disable-tqdm",
            "--result-json", output.rel(result), "--plot", output.rel(result.with_suffix(".png"))]


def run_all(params: dict, paths: dict[str, Path], raw: Path) -> tuple[dict, list[str]]:
    found, commands = {}, []
    for dataset, path in paths.items():
        result = raw / f"{dataset}.json"
        args = simulate_args(params, dataset, path, result)
        runs.lenserve(args, raw / f"{dataset}.log")
        commands.append(runs.shown(args))
        found[dataset] = runs.load_runs(result)
        result.unlink()     # hundreds of MB of token times; the summaries are kept above
    return found, commands


def run_real(quick: bool, raw: Path) -> tuple[list[dict], list[str]]:
    """``policies_cpu``'s runs of the real engine, twice (once with --quick): each run tagged
    with its sweep."""
    from benchmarks import policies_cpu
    params = policies_cpu.QUICK if quick else REAL
    dataset, _ = policies_cpu.dataset_args(None)
    found, commands = [], []
    for sweep in (1,) if quick else (1, 2):
        got, cmds = policies_cpu.run_rates(params, dataset, REAL_POLICIES, raw / f"real{sweep}")
        found += [{**r, "sweep": sweep} for r in got]
        commands += cmds
    return found, commands


def real_table(found: list[dict]) -> list[str]:
    """Per rate and policy: each sweep's normalized latency, its ratio to vllm's in the same
    sweep (min-max over the sweeps) and the failed requests."""
    rows, sweeps = [], sorted({r["sweep"] for r in found})
    for rate in sorted({r["request_rate"] for r in found}):
        for p in REAL_POLICIES:
            cells = {r["sweep"]: r["summary"] for r in found
                     if r["policy"] == p and r["request_rate"] == rate}
            ratios = [cells[w][tables.NL] / base[tables.NL] for w in sweeps if w in cells
                      for base in [next(r["summary"] for r in found if r["sweep"] == w and
                                        r["policy"] == "vllm" and r["request_rate"] == rate)]]
            rows.append([f"{rate:g}", p, *(f"{cells[w][tables.NL]:.4f}" if w in cells else "-"
                                           for w in sweeps),
                         f"{min(ratios):.2f}-{max(ratios):.2f}",
                         str(sum(int(c.get("failed", 0)) for c in cells.values()))])
    return tables.markdown(["rate (req/s)", "policy",
                            *(f"NL sweep {w} (s/token)" for w in sweeps), "NL x vllm (min-max)",
                            "failed (all sweeps)"], rows)


def ssr_points(found: list[dict], policy: str) -> list[tuple[float, float]]:
    """(rate, share of requests missing their JCT SLO): failed requests miss it."""
    return [(r["request_rate"], 1.0 - r["summary"].get("slo_satisfaction_ratio", math.nan))
            for r in found if r["policy"] == policy]


def sustained(found: list[dict]) -> dict[str, dict[str, tuple[float, str]]]:
    """Per policy, the highest rate under each target (``tables.sustained_rate``)."""
    out = {}
    for p in tables.policies(found):
        targets = {f"NL <= {slo:g}": tables.sustained_rate(tables.nl_points(found, p), slo)
                   for slo in NL_SLOS}
        targets[f"SSR >= {SSR_TARGET:.0%}"] = tables.sustained_rate(ssr_points(found, p),
                                                                     1.0 - SSR_TARGET)
        out[p] = targets
    return out


def sustained_table(rates: dict) -> list[str]:
    header, rows = ["policy"], []
    for target in next(iter(rates.values())):
        header += [f"{target}: rate (req/s)", "x vllm-v0", "x sarathi"]
    for p, targets in rates.items():
        row = [p]
        for target, (rate, note) in targets.items():
            row.append(f"{note}{rate:.2f}")
            for base in ("vllm-v0", "sarathi"):
                ref = rates[base][target][0]
                row.append(f"{note}{rate / ref:.2f}" if ref > 0 else "-")
        rows.append(row)
    return tables.markdown(header, rows)


def metrics_table(found: list[dict]) -> list[str]:
    rows = []
    for r in sorted(found, key=lambda r: (r["request_rate"], POLICIES.index(r["policy"]))):
        s = r["summary"]
        rows.append([f"{r['request_rate']:g}", r["policy"],
                     tables.with_failures(f"{s[tables.NL]:.3f}", s),
                     f"{s['jct_ms']['mean'] / 1e3:.1f}", f"{s['slo_satisfaction_ratio']:.0%}",
                     f"{s['max_ttft_ms'] / 1e3:.1f}", f"{s['request_throughput']:.2f}",
                     f"{s['kv_allocated_util']:.0%}", f"{s['kv_used_util']:.0%}",
                     f"{s['num_preemptions']:.0f}", f"{s['schedule_ms_per_iteration']:.3f}",
                     f"{s['schedule_share']:.2%}"])
    return tables.markdown(
        ["rate (req/s)", "policy", "NL (s/token)", "mean JCT (s)", "SSR", "longest wait (s)",
         "req/s done", "KV allocated", "KV holding tokens", "preemptions",
         "scheduler ms/iteration", "scheduler share of JCT"], rows)


def summary_text(found: dict, rates: dict, params: dict, real: list[dict]) -> str:
    ratios = []
    for dataset, by_policy in rates.items():
        target = f"NL <= {NL_SLOS[0]:g}"
        e = by_policy["econoserve"][target][0]
        ratios.append(f"{dataset}: {e / by_policy['vllm-v0'][target][0]:.2f}x `vllm-v0`, "
                      f"{e / by_policy['sarathi'][target][0]:.2f}x `sarathi`")
    return (f"**Every simulated number here is an estimate** of the roofline cost model (`lenserve "
            f"simulate`): OPT-13B on an A100-80GB with the paper's 12 GiB of KV "
            f"({NUM_GPU_BLOCKS} blocks of {BLOCK_SIZE} tokens), {params['num_prompts']:,} "
            f"requests per rate, Poisson arrivals, seed 0, true output lengths for every "
            f"policy. Sustained rate of `econoserve` under normalized latency "
            f"{NL_SLOS[0]:g} s/token: {'; '.join(ratios)} (the paper: >= 2x vLLM on ShareGPT, "
            f">= 1.2x Sarathi-Serve). Exact allocation holds KV for each generation's whole "
            f"padded length, so fewer requests decode at once than under block allocation, "
            f"which preempts cheaply here; see the EconoServe page for why. A failed request "
            f"counts as an SLO miss and disqualifies its rate. Scheduler time is this CPU's "
            f"wall time, shared and noisy, one run per point.{real_text(real)}")


def real_text(real: list[dict]) -> str:
    if not real:
        return ""
    top = max(r["request_rate"] for r in real)
    at_top = {}
    for r in real:
        if r["request_rate"] == top:
            at_top.setdefault(r["policy"], []).append(r["summary"][tables.NL])
    order = sorted(at_top, key=lambda p: max(at_top[p]))
    return (f" The last table checks the ranking on the real engine (measured on a shared CPU, "
            f"{len({r['sweep'] for r in real})} sweeps): at {top:g} req/s, best to worst by "
            f"normalized latency: {', '.join(f'`{p}`' for p in order)}.")


def plot(path: Path, found: dict) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from benchmarks.figures import MARKERS
    fig, axes = plt.subplots(1, len(found), figsize=(5 * len(found), 4), squeeze=False)
    for ax, (dataset, runs_) in zip(axes[0], found.items()):
        for i, p in enumerate(tables.policies(runs_)):
            pts = sorted((r["request_rate"], r["summary"][tables.NL]) for r in runs_
                         if r["policy"] == p)
            ax.plot(*zip(*pts), marker=MARKERS[i], label=p, markersize=4)
        ax.set_yscale("log")
        ax.set_title(f"OPT-13B, A100, 12 GiB KV, {dataset} (simulated)", fontsize=9)
        ax.set_xlabel("request rate (req/s)")
        ax.set_ylabel("normalized latency (s/token)")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    figures.save(fig, path)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = output.parser(__doc__, dataset="ShareGPT file (default: %(default)s)",
                       dataset_default=runs.SHAREGPT)
    ap.add_argument("--alpaca-path", type=Path, default=ALPACA,
                    help="Alpaca JSON (default: %(default)s)")
    ap.add_argument("--skip-real", action="store_true",
                    help="leave out the real-engine check (minutes on a CPU)")
    args = ap.parse_args(argv)
    paths = {"sharegpt": runs.dataset_file(args.dataset_path),
             "alpaca": runs.dataset_file(args.alpaca_path)}
    out, params = output.outputs(args, NAME), QUICK if args.quick else FULL
    start, t0 = stamp.take(), time.perf_counter()
    found, commands = run_all(params, paths, out.raw)
    real, real_commands = ([], []) if args.skip_real else run_real(args.quick, out.raw)
    rates = {d: sustained(f) for d, f in found.items()}
    plot(out.file(NAME, "png"), found)
    section_tables = []
    for dataset in found:
        section_tables += [
            (f"{dataset}: highest rate under each target (interpolated; `>=`: met at every "
             f"tested rate, `<`: at none)", sustained_table(rates[dataset])),
            (f"{dataset}: per rate", metrics_table(found[dataset]))]
    if real:
        section_tables.append(("Real engine (opt-125m on this CPU, `policies_cpu`'s setting, "
                               "measured; NL x vllm within each sweep)", real_table(real)))
    section = output.Section(title="EconoServe at its paper's setting (simulated, estimates)",
                             text=summary_text(found, rates, params, real), tables=section_tables,
                             figure_alt="normalized latency vs rate, OPT-13B on an A100, "
                                        "ShareGPT and Alpaca, simulated")
    output.publish(out, NAME, section, argv=argv, commands=commands + real_commands,
                   stamp=stamp.finish(start, time.perf_counter() - t0),
                   data={"params": {**params, "num_gpu_blocks": NUM_GPU_BLOCKS,
                                    "block_size": BLOCK_SIZE, "nl_slos": NL_SLOS,
                                    "ssr_target": SSR_TARGET,
                                    "datasets": {d: output.rel(p) for d, p in paths.items()}},
                         "sustained": json.loads(json.dumps(rates)), "runs": found,
                         "real_runs": real})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
