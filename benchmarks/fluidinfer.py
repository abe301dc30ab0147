"""FluidInfer's streamed waves, measured: ``fluidinfer`` (and ``alise-fluid``) against ``vllm``.

    python3 benchmarks/fluidinfer.py [--quick] [--dataset-path FILE] [--no-real]

* Real engine on this CPU (``lenserve bench``): opt-125m (random weights, outputs forced to
  their ShareGPT reply's length), 12 prompts of the bundled sample within 256 tokens (138
  tokens a request on average), a device KV pool of 20 blocks of 16 (320 tokens: about two
  mean requests), a 1 GiB host tier, every request arriving at once (saturation); two runs
  of ``vllm``, ``fluidinfer`` and ``alise-fluid`` back to back, the order reversed in the
  second, output tok/s over ``vllm``'s.
* Simulation at the report's settings (``lenserve simulate``, roofline ESTIMATES): OPT-125M
  and OPT-1.3B on one RTX 4090, OPT-6.7B on four RTX 4090s and on four A100-40GBs (PCIe 4.0
  x16 host links), ShareGPT first turns, Poisson arrivals, a KV-limited pool of 256 blocks of
  16 and a 64 GiB host tier: output throughput at the highest rate, the highest rate under a
  normalized-latency SLO and under a P99 latency-bound SLO, the P99 latency bound. The
  baselines are ``vllm`` (V1's scheduler) and ``vllm-v0`` (vLLM 0.2's, the report's
  baseline); the streamed waves run in three modes (``stream_mode``): ``link`` (uploaded over
  PCIe), ``cpu`` (attended on the host CPU, NEO's way) and ``free`` (a link that costs
  nothing: the mechanism's ceiling).
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
BASELINES = ("vllm", "vllm-v0")
# Simulated runs per setting: (label suffix, backends, policy options).
SIM_RUNS = (("", (*BASELINES, "fluidinfer", "alise-fluid"), ()),
            ("cpu", ("fluidinfer", "alise-fluid"), ("stream_mode=cpu",)),
            ("free", ("fluidinfer",), ("stream_mode=free",)))
# From light load to past vllm's saturation on each setting (its output tok/s at overload over
# the mean ShareGPT reply gives about 7, 4, 3 and 3 req/s), and on to where streamed waves
# without the link's cost saturate too.
SETTINGS = (("rtx4090", "opt-125m", [2, 4, 8, 16, 32]), ("rtx4090", "opt-1.3b", [1, 2, 4, 8, 16]),
            ("4x-rtx4090", "opt-6.7b", [1, 2, 4, 8, 16]),
            ("4x-a100-40g", "opt-6.7b", [1, 2, 4, 8, 16]))
FULL = {"sim_prompts": 300, "real_prompts": 12, "real_runs": 2, "rates": None}
QUICK = {"sim_prompts": 16, "real_prompts": 4, "real_runs": 1, "rates": 2}
SIM_BLOCKS, SIM_SWAP_GIB = 256, 64
REAL_BLOCKS, REAL_LEN = 20, 256


def sim_args(hw: str, shape: str, rates: list[float], params: dict, dataset: Path,
             result: Path, backends=(*BASELINES, "fluidinfer", "alise-fluid"),
             options=()) -> list[str]:
    extra = ["--policy-config", *options] if options else []
    return ["simulate", "--hardware", hw, "--model-shape", shape, *extra,
            "--backends", ",".join(f"sim:{p}" for p in backends), "--predictor", "oracle",
            "--dataset-name", "sharegpt", "--dataset-path", str(dataset),
            "--num-prompts", str(params["sim_prompts"]), "--num-gpu-blocks", str(SIM_BLOCKS),
            "--swap-space", str(SIM_SWAP_GIB), "--sweep-rates", ",".join(map(str, rates)),
            "--seed", "0", "--disable-tqdm", "--result-json", output.rel(result)]


def real_args(params: dict, dataset: list[str], result: Path, order=POLICIES) -> list[str]:
    return ["bench", "--model", "opt-125m", *dataset,
            "--backends", ",".join(f"lenserve:{p}" for p in order), "--predictor", "oracle",
            "--num-prompts", str(params["real_prompts"]), "--max-model-len", str(REAL_LEN),
            "--num-gpu-blocks", str(REAL_BLOCKS), "--swap-space", "1", "--seed", "0",
            "--request-rate", "inf", "--disable-tqdm", "--result-json", output.rel(result)]


def run_sims(params: dict, dataset: Path, raw: Path) -> tuple[dict, list[str]]:
    found, commands = {}, []
    for hw, shape, rates in SETTINGS:
        if params.get("setting") not in (None, f"{hw}:{shape}"):
            continue
        rates = rates[-params["rates"]:] if params["rates"] else rates
        found[f"{shape} on {hw}"] = []
        for mode, backends, options in SIM_RUNS:
            name = f"sim_{hw}_{shape}" + (f"_{mode}" if mode else "")
            args = sim_args(hw, shape, rates, params, dataset, raw / f"{name}.json", backends,
                            options)
            _run(args, raw / f"{name}.log", params)
            commands.append(runs.shown(args))
            rename = {p: f"{p} [{mode}]" for p in backends} if mode else None
            found[f"{shape} on {hw}"] += runs.load_runs(raw / f"{name}.json", rename)
    return found, commands


def run_real(params: dict, dataset: list[str], raw: Path) -> tuple[list[list[dict]], list[str]]:
    found, commands = [], []
    for i in range(params["real_runs"]):
        result = raw / f"real_{i}.json"
        # Alternate the order, so that neither policy always runs on a warmer (or busier) box.
        args = real_args(params, dataset, result, POLICIES if i % 2 == 0 else POLICIES[::-1])
        _run(args, raw / f"real_{i}.log", params)
        commands.append(runs.shown(args))
        found.append(runs.load_runs(result))
    return found, commands


def _run(args: list[str], log: Path, params: dict) -> None:
    """Run one command, or (``--reuse``) take its result file where a run left one."""
    result = runs.REPO / args[args.index("--result-json") + 1]
    if not (params.get("reuse") and result.is_file()):
        runs.lenserve(args, log)


def _at(found: list[dict], policy: str, rate: float) -> dict:
    return next(r["summary"] for r in found if r["policy"] == policy and r["request_rate"] == rate)


def sim_table(found: dict) -> list[str]:
    rows = []
    for setting, rs in found.items():
        top, low = max(r["request_rate"] for r in rs), min(r["request_rate"] for r in rs)
        base = {b: _at(rs, b, top) for b in BASELINES}
        nl_slo = 2 * _at(rs, "vllm", low)[tables.NL]
        lb_slo = 2 * _at(rs, "vllm", low)["latency_bound_ms"]["p99"]
        vrate = {"nl": tables.sustained_rate(tables.nl_points(rs, "vllm"), nl_slo)[0],
                 "lb": tables.sustained_rate(bound_points(rs, "vllm"), lb_slo)[0]}
        for p in tables.policies(rs):
            s = _at(rs, p, top)
            nl, nl_note = tables.sustained_rate(tables.nl_points(rs, p), nl_slo)
            lb, lb_note = tables.sustained_rate(bound_points(rs, p), lb_slo)
            tput = s["output_throughput"]
            rows.append([setting, p, f"{tput:.0f}",
                         *(f"{tput / base[b]['output_throughput']:.2f}" for b in BASELINES),
                         f"{nl_note}{nl:.1f} ({_ratio(nl, vrate['nl'])})",
                         f"{lb_note}{lb:.1f} ({_ratio(lb, vrate['lb'])})",
                         f"{s['latency_bound_ms']['p99']:.0f}", hidden(s)])
    return tables.markdown(["setting", "policy [stream mode]", "output tok/s (top rate)",
                            "x vllm", "x vllm-v0", "rate at NL <= 2x vllm's light-load NL "
                            "(x vllm)", "rate at P99 latency bound <= 2x vllm's light-load "
                            "bound (x vllm)", "P99 latency bound (ms, top rate)",
                            "streamed work hidden (top rate)"], rows)


def _ratio(value: float, base: float) -> str:
    return f"{value / base:.2f}x" if base and base == base else "-"


def bound_points(runs: list[dict], policy: str) -> list[tuple[float, float]]:
    """(rate, P99 latency bound) of a policy's runs; a run with failures misses the bound."""
    return [(r["request_rate"], float("inf") if r["summary"].get("failed")
             else r["summary"]["latency_bound_ms"]["p99"]) for r in runs if r["policy"] == policy]


def hidden(summary: dict) -> str:
    """Share of the streamed waves' off-device time (link copies, or the host CPU's
    attention) hidden behind compute, and the stalls."""
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
                     f"{ratios[-1]:.2f}", *(
                         [f"{tput['alise-fluid']:.1f}", f"{tput['alise-fluid'] / tput['vllm']:.2f}"]
                         if "alise-fluid" in tput else ["-", "-"])])
    return tables.markdown(["run", "vllm tok/s", "fluidinfer tok/s", "ratio",
                            "alise-fluid tok/s", "ratio"], rows), ratios


def section(sims: dict, real: list[list[dict]], run_stamp: dict) -> output.Section:
    parts = [("Simulated at the report's settings (ESTIMATES)", sim_table(sims))]
    text = ("`fluidinfer` runs every swapped request in the iteration with its KV streamed "
            "from the host tier layer by layer (Fig. 7b-8), its token budget the one that "
            "saturates the token-wise layers; where copies overlap compute it streams only what "
            "the streamed waves' path gets through within an iteration's compute. Stream modes: "
            "`link` (each wave's KV uploaded over PCIe), `cpu` (attended on the host CPU where "
            "the KV lives, NEO's way; only queries, new K/V and outputs cross the link), "
            "`free` (a link that costs nothing: the mechanism's ceiling). `vllm-v0` is vLLM "
            "0.2's scheduler (prefill-first, recompute preemption), the report's baseline. "
            "Simulated figures are roofline estimates with a 256-block KV pool and a 64 GiB "
            "host tier, the rates from light load to past every policy's saturation; an SLO "
            "rate of `>=` means every tested rate met it. ")
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
                    help="prompts per real-engine run (default 12)")
    ap.add_argument("--sim-prompts", type=int, default=None,
                    help="requests per simulated rate (default 300)")
    ap.add_argument("--only", choices=("sim", "real"), default=None,
                    help="run only the simulations or the real-engine runs, and publish nothing "
                         "(a later --reuse publishes both)")
    ap.add_argument("--setting", default=None, choices=[f"{h}:{m}" for h, m, _ in SETTINGS],
                    help="with --only sim: simulate this setting only (run them side by side)")
    ap.add_argument("--reuse", action="store_true",
                    help="take each run's result file where one exists instead of running it")
    args = ap.parse_args(argv)
    out, params = output.outputs(args, NAME), dict(QUICK if args.quick else FULL)
    for key in ("real_prompts", "sim_prompts"):
        if getattr(args, key):
            params[key] = getattr(args, key)
    params["reuse"], params["setting"] = args.reuse, args.setting
    dataset = runs.dataset_file(args.dataset_path)
    start, t0 = stamp.take(), time.perf_counter()
    if args.only == "real":
        run_real(params, dataset_args(args.dataset_path)[0], out.raw)
        return 0
    sims, commands = run_sims(params, dataset, out.raw)
    if args.only == "sim":
        return 0
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
