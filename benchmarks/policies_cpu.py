"""The policies on the real engine on this CPU: ``lenserve bench`` with opt-125m (random
weights; every output forced to its ShareGPT reply's length), ``vllm`` against ``alise`` on
the embedded predictor and ``oracle`` on the true lengths, a KV pool small enough that
requests queue, a few Poisson rates.

    python3 benchmarks/policies_cpu.py [--quick] [--dataset-path FILE] [--policies ...]

Timings move with the machine and its load: the stamp records how busy other work kept the
cores, and the page says so when they were shared.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

if __package__ in (None, ""):       # run as a script: the repository root holds benchmarks/
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import figures, output, runs, stamp, tables

NAME = "policies_cpu"
POLICIES = ("vllm", "alise", "oracle")
# On the idle 2-core machine the engine (bfloat16) keeps up with 2 req/s of this workload
# without queueing; 8 req/s is past what a pool of about 7 requests serves, so the rates span
# light load to overload. Nine runs of about 6,000 output tokens: ~6 minutes idle.
FULL = {"num_prompts": 60, "rates": [2.0, 4.0, 8.0]}
QUICK = {"num_prompts": 4, "rates": [2.0]}
NUM_GPU_BLOCKS, BLOCK_SIZE = 64, 16   # 1,024 tokens: a handful of requests at a time
MAX_MODEL_LEN = 256


def bundled_sharegpt() -> Path | None:
    """The ShareGPT sample lenserve ships, where this version ships one."""
    try:
        from lenserve.workloads import bundled_sharegpt_path
    except ImportError:
        return None
    path = bundled_sharegpt_path()
    return path if path.is_file() else None


def dataset_args(path: Path | None) -> tuple[list[str], str]:
    """The bench's dataset flags and a name for the page: the bundled sample unless a file is
    named or none is bundled (then the shared ShareGPT file, with a clear error if absent)."""
    if path is None and (bundled := bundled_sharegpt()) is not None:
        return ["--dataset-name", "sharegpt"], f"the bundled ShareGPT sample ({bundled.name})"
    file = runs.dataset_file(path)
    return ["--dataset-name", "sharegpt", "--dataset-path", str(file)], f"ShareGPT ({file.name})"


def bench_args(params: dict, dataset: list[str], policies: list[str], rate: float,
               result: Path) -> list[str]:
    return ["bench", "--model", "opt-125m", *dataset,
            "--backends", ",".join(f"lenserve:{p}" for p in policies),
            "--predictor", "embedded", "--num-prompts", str(params["num_prompts"]),
            "--max-model-len", str(MAX_MODEL_LEN), "--num-gpu-blocks", str(NUM_GPU_BLOCKS),
            "--swap-space", "1", "--seed", "0", "--request-rate", f"{rate:g}",
            "--disable-tqdm", "--result-json", output.rel(result)]


def run_rates(params: dict, dataset: list[str], policies: list[str],
              raw: Path) -> tuple[list[dict], list[str]]:
    """One ``lenserve bench`` per rate, every policy back to back in it: the policies of one
    rate then meet about the same load from other work, where one sweep (each policy through
    every rate in turn) would let a change of load pass for a difference of policy."""
    found, commands = [], []
    for rate in params["rates"]:
        result = raw / f"bench_{rate:g}.json"
        command = bench_args(params, dataset, policies, rate, result)
        runs.lenserve(command, raw / f"bench_{rate:g}.log")
        commands.append(runs.shown(command))
        found += runs.load_runs(result)
    return found, commands


def rate_policy_table(found: list[dict]) -> list[str]:
    """One row per rate and policy: the metrics the page compares, and NL over vllm's."""
    rows = []
    for r in sorted(found, key=lambda r: r["request_rate"]):
        s, ratio = r["summary"], tables.ratio_at(found, r["policy"], "vllm", r["request_rate"])
        rows.append([f"{r['request_rate']:g}", r["policy"], f"{s[tables.NL]:.4f}",
                     f"{ratio:.2f}", f"{s['ttft_ms']['mean']:.0f}",
                     f"{s['e2el_ms']['p99'] / 1e3:.1f}", f"{s['output_throughput']:.1f}",
                     f"{s.get('failed', 0):.0f}"])
    return tables.markdown(["rate (req/s)", "policy", "NL (s/token)", "NL x vllm",
                            "mean TTFT (ms)", "P99 E2E (s)", "output tok/s", "failed"], rows)


def summary_text(found: list[dict], params: dict, dataset: str, run_stamp: dict) -> str:
    s = found[0]["summary"]
    mean_tokens = (s["total_input_tokens"] + s["total_output_tokens"]) / max(1, s["completed"])
    pool = NUM_GPU_BLOCKS * BLOCK_SIZE
    top = max(r["request_rate"] for r in found)
    ratios = ", ".join(f"`{p}` {tables.ratio_at(found, p, 'vllm', top):.2f}x"
                       for p in tables.policies(found) if p != "vllm")
    pred = next((r["predictions"] for r in found if r["policy"] == "alise" and r["predictions"]),
                None)
    # The bench keeps only records whose prompt and reply fit --max-model-len (as vLLM's
    # benchmark does), so replies are shorter than the predictor's ShareGPT prior expects.
    alise = (f"`alise` ranks by the embedded predictor's own predictions (median relative "
             f"error {pred['median_abs_rel_error']:.2f} at the lowest rate; the sample keeps "
             f"only requests that fit {MAX_MODEL_LEN} tokens, shorter than the replies the "
             f"predictor learnt from), " if pred else "")
    shared = ("The CPU was shared with other work during the run (see the stamp), which slows "
              "every policy, and unevenly as that work comes and goes; one run per point. "
              if stamp.cpu_was_shared(run_stamp) else "One run per point. ")
    return (f"Measured on the real engine (`lenserve bench`) on the CPU the stamp names: "
            f"opt-125m with random weights, every output forced to its reply's length, "
            f"{params['num_prompts']} prompts of {dataset}, Poisson arrivals, seed 0. The KV "
            f"pool of {pool:,} tokens holds about {pool / mean_tokens:.0f} requests of this "
            f"workload's mean size ({mean_tokens:.0f} tokens); {queueing(found)} {alise}"
            f"`oracle` by the true lengths; the baseline is `vllm`. Each rate is one run with "
            f"the policies back to back. Normalized latency over "
            f"`vllm`'s at {top:g} req/s: {ratios}. {shared}{load_spread(found)}")


def queueing(found: list[dict]) -> str:
    """How long ``vllm``'s requests waited for their first token at the lowest and highest
    rate: whether the chosen rates made requests queue, from the run itself."""
    ttft = {r["request_rate"]: r["summary"]["ttft_ms"]["mean"] for r in found
            if r["policy"] == "vllm"}
    low, high = min(ttft), max(ttft)
    return (f"`vllm`'s mean time to first token was {ttft[low]:.0f} ms at {low:g} req/s and "
            f"{ttft[high]:.0f} ms at {high:g} req/s.")


def load_spread(found: list[dict], limit: float = 1.5) -> str:
    """A warning when the policies' runs at the lowest rate, which all receive the same work,
    delivered output at rates more than ``limit`` apart: the engine's speed changed under
    them, so their ratios measure the machine's load as much as the policies."""
    low = min(r["request_rate"] for r in found)
    tput = [r["summary"]["output_throughput"] for r in found if r["request_rate"] == low]
    if min(tput) <= 0 or max(tput) / min(tput) <= limit:
        return ""
    return (f"At {low:g} req/s, where every policy receives the same work, output throughput "
            f"ranged from {min(tput):.0f} to {max(tput):.0f} tok/s between the policies' runs: "
            f"the engine's speed changed under them, so these ratios reflect the machine's load "
            f"as much as the policies.")


def plot(path: Path, found: list[dict]) -> None:
    figures.nl_vs_rate(path, found, "Normalized latency vs rate, opt-125m on this CPU "
                       "(measured)")


def section(found: list[dict], params: dict, dataset: str, run_stamp: dict) -> output.Section:
    return output.Section(
        title="Policies on the real engine (this CPU, opt-125m)",
        text=summary_text(found, params, dataset, run_stamp),
        tables=[("Per rate and policy (NL: normalized latency; x vllm: over vllm's at the "
                 "same rate)", rate_policy_table(found))],
        figure_alt="normalized latency vs request rate per policy, real engine on a CPU")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = output.parser(__doc__, dataset="ShareGPT file (default: the bundled sample, else "
                       f"{runs.SHAREGPT})")
    ap.add_argument("--policies", default=",".join(POLICIES),
                    help="comma-separated; vllm first, the baseline (default: %(default)s; "
                         "econoserve and fluidinfer also run)")
    args = ap.parse_args(argv)
    policies = [p for p in args.policies.split(",") if p]
    if not policies or policies[0] != "vllm":
        raise SystemExit("--policies must start with vllm, the baseline of every ratio")
    dataset, dataset_name = dataset_args(args.dataset_path)
    out, params = output.outputs(args, NAME), QUICK if args.quick else FULL
    start, t0 = stamp.take(), time.perf_counter()
    found, commands = run_rates(params, dataset, policies, out.raw)
    run_stamp = stamp.finish(start, time.perf_counter() - t0)
    plot(out.file(NAME, "png"), found)
    output.publish(out, NAME, section(found, params, dataset_name, run_stamp), argv=argv,
                   commands=commands, stamp=run_stamp,
                   data={"params": {**params, "policies": policies, "dataset": dataset_name,
                                    "num_gpu_blocks": NUM_GPU_BLOCKS, "block_size": BLOCK_SIZE,
                                    "max_model_len": MAX_MODEL_LEN},
                         "runs": found})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
