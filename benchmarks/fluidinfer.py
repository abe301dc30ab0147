"""FluidInfer's streamed waves, measured: ``fluidinfer`` (and ``alise-fluid``) against ``vllm``.

    python3 benchmarks/fluidinfer.py [--quick] [--dataset-path FILE] [--no-real]

* Real engine on this CPU (``lenserve bench``): opt-125m (random weights, outputs forced to
  their ShareGPT reply's length), a device KV pool of 32 blocks of 16 (512 tokens: about two
  mean requests of the sample), a 1 GiB host tier, every request arriving at once
  (saturation); two runs with the policies back to back, output tok/s over ``vllm``'s.
* Simulation at the report's settings (``lenserve simulate``, roofline ESTIMATES): OPT-125M
  and OPT-1.3B on one RTX 4090, OPT-6.7B on four RTX 4090s and on four A100-40GBs (PCIe 4.0
  x16 host links), ShareGPT first turns, Poisson arrivals, a KV-limited pool of 256 blocks of
  16 and a 64 GiB host tier: output throughput at the highest rate, the highest rate under a
  normalized-latency SLO and the P99 latency bound.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

if __package__ in (None, ""):       # run as a script: the repository root holds benchmarks/
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import figures, output, runs, stamp, tables
from benchmarks.policies_cpu import dataset_args

NAME = "fluidinfer"
POLICIES = ("vllm", "fluidinfer", "alise-fluid")
# From light load to past vllm's saturation on each setting (its output tok/s at overload over
# the mean ShareGPT reply gives about 7, 4, 3 and 3 req/s).
SETTINGS = (("rtx4090", "opt-125m", [2, 4, 8, 16]), ("rtx4090", "opt-1.3b", [1, 2, 4, 8]),
            ("4x-rtx4090", "opt-6.7b", [1, 2, 4, 8]), ("4x-a100-40g", "opt-6.7b", [1, 2, 4, 8]))
FULL = {"sim_prompts": 500, "real_prompts": 24, "real_runs": 2, "rates": None}
QUICK = {"sim_prompts": 16, "real_prompts": 4, "real_runs": 1, "rates": 2}
SIM_BLOCKS, SIM_SWAP_GIB = 256, 64
REAL_BLOCKS, REAL_LEN = 32, 256


def sim_args(hw: str, shape: str, rates: list[float], params: dict, dataset: Path,
             result: Path) -> list[str]:
    return ["simulate", "--hardware", hw, "--model-shape", shape,
            "--backends", ",".join(f"sim:{p}" for p in POLICIES), "--predictor", "oracle",
            "--dataset-name", "sharegpt", "--dataset-path", str(dataset),
            "--num-prompts", str(params["sim_prompts"]), "--num-gpu-blocks", str(SIM_BLOCKS),
            "--swap-space", str(SIM_SWAP_GIB), "--sweep-rates", ",".join(map(str, rates)),
            "--seed", "0", "--disable-tqdm", "--result-json", output.rel(result)]


def real_args(params: dict, dataset: list[str], result: Path) -> list[str]:
    return ["bench", "--model", "opt-125m", *dataset,
            "--backends", ",".join(f"lenserve:{p}" for p in POLICIES[:2]),
            "--num-prompts", str(params["real_prompts"]), "--max-model-len", str(REAL_LEN),
            "--num-gpu-blocks", str(REAL_BLOCKS), "--swap-space", "1", "--seed", "0",
            "--request-rate", "inf", "--disable-tqdm", "--result-json", output.rel(result)]


def run_sims(params: dict, dataset: Path, raw: Path) -> tuple[dict, list[str]]:
    found, commands = {}, []
    for hw, shape, rates in SETTINGS:
        rates = rates[-params["rates"]:] if params["rates"] else rates
        result = raw / f"sim_{hw}_{shape}.json"
        args = sim_args(hw, shape, rates, params, dataset, result)
        runs.lenserve(args, raw / f"sim_{hw}_{shape}.log")
        commands.append(runs.shown(args))
        found[f"{shape} on {hw}"] = runs.load_runs(result)
    return found, commands


def run_real(params: dict, dataset: list[str], raw: Path) -> tuple[list[list[dict]], list[str]]:
    found, commands = [], []
    for i in range(params["real_runs"]):
        result = raw / f"real_{i}.json"
        args = real_args(params, dataset, result)
        runs.lenserve(args, raw / f"real_{i}.log")
        commands.append(runs.shown(args))
        found.append(runs.load_runs(result))
    return found, commands


def _at(found: list[dict], policy: str, rate: float) -> dict:
    return next(r["summary"] for r in found if r["policy"] == policy and r["request_rate"] == rate)


def sim_table(found: dict) -> list[str]:
    rows = []
    for setting, rs in found.items():
        top = max(r["request_rate"] for r in rs)
        base = _at(rs, "vllm", top)
        slo = 2 * _at(rs, "vllm", min(r["request_rate"] for r in rs))[tables.NL]
        vrate, _ = tables.sustained_rate(tables.nl_points(rs, "vllm"), slo)
        for p in POLICIES:
            s = _at(rs, p, top)
            rate, note = tables.sustained_rate(tables.nl_points(rs, p), slo)
            rows.append([setting, p, f"{s['output_throughput']:.0f}",
                         f"{s['output_throughput'] / base['output_throughput']:.2f}",
                         f"{note}{rate:.1f}", f"{rate / vrate:.2f}" if vrate else "-",
                         f"{s['latency_bound_ms']['p99']:.0f}",
                         f"{base['latency_bound_ms']['p99'] / s['latency_bound_ms']['p99']:.2f}",
                         hidden(s)])
    return tables.markdown(["setting", "policy", "output tok/s (top rate)", "x vllm",
                            "rate at NL <= 2x vllm's light-load NL", "x vllm",
                            "P99 latency bound (ms, top rate)", "vllm's / this",
                            "copy hidden (top rate)"], rows)


def hidden(summary: dict) -> str:
    """Share of the streamed waves' host-link time hidden behind compute, and the stalls."""
    copy = summary.get("stream_copy_s", 0.0)
    if not copy:
        return "-"
    return (f"{summary['stream_hidden_s'] / copy:.0%} of {copy:.1f} s "
            f"(stall {summary['stream_stall_s']:.1f} s)")


def real_table(found: list[list[dict]]) -> tuple[list[str], list[float]]:
    rows, ratios = [], []
    for i, rs in enumerate(found):
        tput = {r["policy"]: r["summary"]["output_throughput"] for r in rs}
        ratios.append(tput["fluidinfer"] / tput["vllm"])
        rows.append([str(i + 1), f"{tput['vllm']:.1f}", f"{tput['fluidinfer']:.1f}",
                     f"{ratios[-1]:.2f}"])
    return tables.markdown(["run", "vllm tok/s", "fluidinfer tok/s", "ratio"], rows), ratios


def section(sims: dict, real: list[list[dict]], run_stamp: dict) -> output.Section:
    parts = [("Simulated at the report's settings (ESTIMATES)", sim_table(sims))]
    text = ("`fluidinfer` runs every swapped request in the iteration with its KV streamed "
            "from the host tier layer by layer (Fig. 7b-8); where copies overlap compute it "
            "streams only the KV the host link uploads within an iteration's compute. "
            "Simulated figures are roofline estimates with a 256-block KV pool and a 64 GiB "
            "host tier. ")
    if real:
        lines, ratios = real_table(real)
        parts.insert(0, ("Real engine on this CPU, saturation (output tok/s)", lines))
        text += (f"On the real CPU engine `fluidinfer` delivered {min(ratios):.2f}-"
                 f"{max(ratios):.2f}x `vllm`'s output throughput over {len(ratios)} run(s)"
                 f"{' (the CPU was shared with other work)' if stamp.cpu_was_shared(run_stamp) else ''}.")
    return output.Section(title="FluidInfer: streamed attention waves", text=text,
                          tables=parts, figure_alt="normalized latency vs rate per policy")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = output.parser(__doc__, dataset=f"ShareGPT file (default: {runs.SHAREGPT})")
    ap.add_argument("--no-real", action="store_true", help="skip the real-engine runs")
    ap.add_argument("--real-prompts", type=int, default=None,
                    help="prompts per real-engine run (default 24; fewer on a busy machine)")
    args = ap.parse_args(argv)
    out, params = output.outputs(args, NAME), dict(QUICK if args.quick else FULL)
    if args.real_prompts:
        params["real_prompts"] = args.real_prompts
    dataset = runs.dataset_file(args.dataset_path)
    start, t0 = stamp.take(), time.perf_counter()
    sims, commands = run_sims(params, dataset, out.raw)
    real = []
    if not args.no_real:
        real, more = run_real(params, dataset_args(args.dataset_path)[0], out.raw)
        commands += more
    run_stamp = stamp.finish(start, time.perf_counter() - t0)
    first = next(iter(sims.values()))
    figures.nl_vs_rate(out.file(NAME, "png"), first,
                       f"Normalized latency vs rate, {next(iter(sims))} (simulated)")
    output.publish(out, NAME, section(sims, real, run_stamp), argv=argv, commands=commands,
                   stamp=run_stamp, data={"params": params, "simulated": sims, "real": real})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
