"""Automatic prefix caching, measured two ways.

* Real engine on this CPU (``lenserve bench``, opt-125m with random weights): multi-turn
  ShareGPT (each turn carries the conversation so far; the next turn follows the reply after
  a think time), conversations arriving at a loaded rate; caching off against on, back to
  back, twice: mean and P99 TTFT, output tok/s, prefix hit rate.
* Simulator (``lenserve simulate --hardware a100-80g --model-shape llama-2-7b``): the Mooncake
  conversation trace, whose hash ids give its exact prefix structure, replayed in its own
  order at several speeds; caching off against on: hit rate against the trace's ideal (every
  repeated block served), mean TTFT, the highest load under a TTFT SLO; and ``alise`` (true
  lengths) against ``vllm`` with caching off and on.

    python3 benchmarks/prefix_caching.py [--quick] [--dataset-path SHAREGPT] [--trace FILE]

Timings of the real engine move with the machine and its load (the stamp says how busy it
was); simulated figures are virtual time and do not.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

if __package__ in (None, ""):       # run as a script: the repository root holds benchmarks/
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import figures, output, runs, stamp, tables

NAME = "prefix_caching"
MOONCAKE = runs.SHAREGPT.parent / "mooncake_conversation_trace.jsonl.gz"
CONVERSATIONS = runs.SHAREGPT.parent / "sharegpt_v3_conversations_first17671.jsonl.gz"
# Real engine: turns of up to 512 prompt tokens, outputs forced short (the CPU decodes slowly;
# the cache acts on prefill), a pool that holds a few conversations.
CPU = {"model": "opt-125m", "num_prompts": 8, "rate": 1.0, "think": 1.0, "output_len": 24, "max_prompt_len": 512,
       "max_model_len": 640, "num_gpu_blocks": 96, "runs": 2}
CPU_QUICK = {**CPU, "num_prompts": 4, "runs": 1}
# Simulator: the first requests of the trace, each 512-token hash block scaled to 64 tokens so
# that prompts fit Llama-2-7B's 4,096-token context (mean prompt about 1,500 tokens).
SIM = {"num_prompts": 1000, "block_tokens": 64, "scales": [1.0, 0.5, 0.25],
       "ttft_slo_ms": 1000.0}
SIM_QUICK = {**SIM, "num_prompts": 40, "scales": [1.0]}
MODES = {"off": ["--no-prefix-caching"], "device": []}


def cpu_args(p: dict, mode: str, dataset: Path | None, result: Path) -> list[str]:
    data = ["--dataset-path", str(dataset)] if dataset else []
    return ["bench", "--model", p["model"], "--backends", "lenserve:vllm",
            "--dataset-name", "sharegpt-multiturn", *data, "--num-prompts", str(p["num_prompts"]),
            "--request-rate", f"{p['rate']:g}", "--think-time", f"{p['think']:g}",
            "--output-len", str(p["output_len"]), "--max-prompt-len", str(p["max_prompt_len"]),
            "--max-model-len", str(p["max_model_len"]), "--num-gpu-blocks",
            str(p["num_gpu_blocks"]), "--swap-space", "0", "--seed", "0", "--disable-tqdm",
            *MODES[mode], "--result-json", output.rel(result)]


def sim_args(p: dict, policy: str, mode: str, scale: float, trace: Path,
             result: Path) -> list[str]:
    predictor = ["--predictor", "oracle"] if policy == "alise" else []
    return ["simulate", "--hardware", "a100-80g", "--model-shape", "llama-2-7b",
            "--backends", f"sim:{policy}", *predictor, "--dataset-name", "mooncake",
            "--dataset-path", str(trace), "--num-prompts", str(p["num_prompts"]),
            "--trace-timestamps", "--trace-time-scale", f"{scale:g}",
            "--trace-block-tokens", str(p["block_tokens"]), "--max-model-len", "4096",
            "--max-prompt-len", "4000", "--seed", "0", *MODES[mode], "--disable-tqdm",
            "--result-json", output.rel(result)]


def run_cpu(p: dict, dataset: Path | None, raw: Path) -> tuple[list[dict], list[str]]:
    found, commands = [], []
    for i in range(p["runs"]):
        for mode in MODES:
            result = raw / f"cpu_{mode}_{i}.json"
            command = cpu_args(p, mode, dataset, result)
            runs.lenserve(command, raw / f"cpu_{mode}_{i}.log")
            commands.append(runs.shown(command))
            found += [{**r, "mode": mode, "run": i} for r in runs.load_runs(result)]
    return found, commands


def run_sim(p: dict, trace: Path, raw: Path) -> tuple[list[dict], list[str]]:
    found, commands = [], []
    for policy in ("vllm", "alise"):
        for mode in MODES:
            for scale in p["scales"]:
                result = raw / f"sim_{policy}_{mode}_{scale:g}.json"
                command = sim_args(p, policy, mode, scale, trace, result)
                runs.lenserve(command, raw / f"sim_{policy}_{mode}_{scale:g}.log")
                commands.append(runs.shown(command))
                for r in runs.load_runs(result):
                    found.append({**r, "mode": mode, "scale": scale,
                                  "request_rate": r["summary"]["request_throughput"]})
    return found, commands


def ideal_hit_rate(p: dict, trace: Path) -> float:
    """The share of the sampled prompts' tokens an unbounded cache would serve (sampled as
    ``simulate`` samples them: synthesised in opt-125m's vocabulary, which it counts in for a
    model shape that is not a preset)."""
    from lenserve.workloads.datasets import load_samples
    from lenserve.workloads.multiturn import ideal_hit_tokens
    from lenserve.workloads.sampling import SampleConfig, sample_requests
    from services.executor.factory import load_tokenizer
    cfg = SampleConfig(p["num_prompts"], seed=0, max_prompt_len=4000, max_total_len=4096,
                       contiguous=True, trace_block_tokens=p["block_tokens"])
    chosen = sample_requests(load_samples("mooncake", trace), cfg, load_tokenizer("opt-125m"))
    total, hits = ideal_hit_tokens([r.prompt_token_ids for r, _ in chosen], 16)
    return hits / total if total else 0.0


def _hit(s: dict) -> str:
    rate = s.get("prefix_cache_hit_rate")
    return f"{rate:.1%}" if rate is not None else "0.0%"


def cpu_table(found: list[dict]) -> list[str]:
    rows = [[str(r["run"] + 1), r["mode"], f"{r['summary']['ttft_ms']['mean']:.0f}",
             f"{r['summary']['ttft_ms']['p99']:.0f}", f"{r['summary']['output_throughput']:.1f}",
             _hit(r["summary"])] for r in found]
    return tables.markdown(["run", "caching", "mean TTFT (ms)", "P99 TTFT (ms)",
                            "output tok/s", "hit rate"], rows)


def cpu_ratio(found: list[dict]) -> tuple[float, float]:
    """Mean TTFT with caching over without, per run: (min, max)."""
    ratios = []
    for i in {r["run"] for r in found}:
        ttft = {r["mode"]: r["summary"]["ttft_ms"]["mean"] for r in found if r["run"] == i}
        if ttft.get("off"):
            ratios.append(ttft["device"] / ttft["off"])
    return (min(ratios), max(ratios)) if ratios else (float("nan"), float("nan"))


def sim_table(found: list[dict]) -> list[str]:
    rows = [[r["policy"], r["mode"], f"{1 / r['scale']:.1f}x", f"{r['request_rate']:.2f}",
             f"{r['summary']['ttft_ms']['mean']:.0f}", f"{r['summary']['ttft_ms']['p99']:.0f}",
             _hit(r["summary"]), f"{r['summary'].get('num_preemptions', 0):.0f}"]
            for r in sorted(found, key=lambda r: (r["policy"] != "vllm", r["mode"], -r["scale"]))]
    return tables.markdown(["policy", "caching", "trace speed", "served req/s", "mean TTFT (ms)",
                            "P99 TTFT (ms)", "hit rate", "preemptions"], rows)


def sustained(found: list[dict], policy: str, mode: str, slo_ms: float) -> str:
    points = [(r["request_rate"], r["summary"]["ttft_ms"]["mean"]) for r in found
              if r["policy"] == policy and r["mode"] == mode]
    rate, note = tables.sustained_rate(points, slo_ms)
    return f"{note}{rate:.2f}"


def summary_text(cpu: list[dict], sim: list[dict], ideal: float, p: dict, q: dict,
                 run_stamp: dict) -> str:
    base = [r for r in sim if r["policy"] == "vllm" and r["scale"] == max(q["scales"])]
    hit = next((r["summary"].get("prefix_cache_hit_rate", 0) for r in base
                if r["mode"] == "device"), 0.0)
    slo = q["ttft_slo_ms"]
    shared = ("The CPU was shared with other work during the run (see the stamp): its "
              "timings are noisy. " if stamp.cpu_was_shared(run_stamp) else "")
    return (f"{_cpu_text(cpu, p, shared)}Simulator (estimates): the first {q['num_prompts']} requests of the Mooncake "
            f"conversation trace at A100/Llama-2-7B, hash blocks scaled to "
            f"{q['block_tokens']} tokens: `vllm` served {hit:.1%} of prompt tokens from cache "
            f"against the trace's ideal {ideal:.1%} (an unbounded cache; the hit rate counts "
            f"readmissions after preemption too). Highest rate with mean TTFT under "
            f"{slo:g} ms: `vllm` {sustained(sim, 'vllm', 'off', slo)} req/s without caching, "
            f"{sustained(sim, 'vllm', 'device', slo)} with; `alise` "
            f"{sustained(sim, 'alise', 'off', slo)} and {sustained(sim, 'alise', 'device', slo)}."
            f" The host tier for cached prefixes is not built yet, so there is no device+host "
            f"column.")


def _cpu_text(cpu: list[dict], p: dict, shared: str) -> str:
    if not cpu:
        return ("The real-engine part was not run this time (`--parts sim`), so the page has "
                "no measured timings. ")
    lo, hi = cpu_ratio(cpu)
    return (f"Real engine ({p['model']}): {p['num_prompts']} turns of multi-turn ShareGPT, "
            f"conversations at {p['rate']:g}/s, think time {p['think']:g} s, outputs forced to "
            f"{p['output_len']} tokens; mean TTFT with caching over without was {lo:.2f}-"
            f"{hi:.2f} (min-max of {p['runs']} runs, each pair back to back). {shared}")


def section(cpu, sim, ideal, p, q, run_stamp) -> output.Section:
    return output.Section(
        title="Prefix caching (simulated A100 on the Mooncake trace"
              + ("; real engine on this CPU)" if cpu else ")"),
        text=summary_text(cpu, sim, ideal, p, q, run_stamp),
        tables=[*([("Real engine, multi-turn ShareGPT (opt-125m, this CPU)", cpu_table(cpu))]
                  if cpu else []),
                ("Simulated A100/Llama-2-7B, Mooncake conversation trace (estimates)",
                 sim_table(sim))],
        figure_alt="mean TTFT against served rate, caching off and on, vllm and alise")


def plot(path: Path, sim: list[dict]) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for (policy, mode), marker in zip([(p, m) for p in ("vllm", "alise") for m in MODES], "osD^"):
        pts = sorted((r["request_rate"], r["summary"]["ttft_ms"]["mean"]) for r in sim
                     if r["policy"] == policy and r["mode"] == mode)
        if pts:
            ax.plot(*zip(*pts), marker=marker, label=f"{policy}, caching {mode}")
    ax.set_xlabel("served request rate (req/s)")
    ax.set_ylabel("mean TTFT (ms)")
    ax.set_yscale("log")
    ax.set_title("Mooncake conversation trace, simulated A100/Llama-2-7B (estimates)",
                 fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    figures.save(fig, path)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = output.parser(__doc__, dataset="ShareGPT conversations file for the real-engine "
                       "part (default: the sample bundled with lenserve)")
    ap.add_argument("--trace", type=Path, default=MOONCAKE,
                    help="Mooncake conversation trace (default: %(default)s)")
    ap.add_argument("--parts", default="sim,cpu",
                    help="which parts to run: sim (virtual time), cpu (the real engine); "
                         "default %(default)s")
    ap.add_argument("--model", default="opt-125m",
                    help="model of the real-engine part (fake: the test double, no timing)")
    args = ap.parse_args(argv)
    trace = runs.dataset_file(args.trace)
    out = output.outputs(args, NAME)
    p, q = (CPU_QUICK, SIM_QUICK) if args.quick else (CPU, SIM)
    p = {**p, "model": args.model}
    start, t0 = stamp.take(), time.perf_counter()
    parts = {part for part in args.parts.split(",") if part}
    if "sim" not in parts or parts - {"sim", "cpu"}:
        raise SystemExit(f"--parts takes sim, or sim,cpu; got {args.parts!r}")
    sim, sim_commands = run_sim(q, trace, out.raw) if "sim" in parts else ([], [])
    cpu, cpu_commands = run_cpu(p, args.dataset_path, out.raw) if "cpu" in parts else ([], [])
    ideal = ideal_hit_rate(q, trace)
    run_stamp = stamp.finish(start, time.perf_counter() - t0)
    plot(out.file(NAME, "png"), sim)
    output.publish(out, NAME, section(cpu, sim, ideal, p, q, run_stamp), argv=argv,
                   commands=cpu_commands + sim_commands, stamp=run_stamp,
                   data={"params": {"cpu": p, "sim": q}, "ideal_hit_rate": ideal,
                         "cpu_runs": cpu, "sim_runs": sim})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
