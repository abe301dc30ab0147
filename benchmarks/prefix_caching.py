"""Automatic prefix caching with its host tier, measured two ways.

* Real engine on this CPU (``lenserve bench``, opt-125m with random weights): multi-turn
  ShareGPT (each turn carries the conversation so far; the next turn follows the reply after
  a think time), conversations arriving at a loaded rate into a small KV pool; caching off,
  device only and device + host tier, interleaved, twice: mean and P99 TTFT, output tok/s,
  prefix hit rate.
* Simulator (``lenserve simulate --hardware a100-80g --model-shape llama-2-7b``): the Mooncake
  conversation trace, whose hash ids give its exact prefix structure, replayed in its own
  order at speeds from 0.8x to 1.25x; caching off, device only and device + host tier: hit
  rate against the trace's ideal (every repeated block served), TTFT, the highest rate whose
  mean TTFT stays under an SLO; for ``vllm`` and ``alise`` (true lengths).

Every mode gets the same ``--swap-space`` (a policy that swaps swaps alike in all three);
the host tier is ``--prefix-cache-host-blocks`` of it.

    python3 benchmarks/prefix_caching.py [--quick] [--parts sim,cpu] [--dataset-path SHAREGPT]
                                         [--trace FILE]

Timings of the real engine move with the machine and its load (the stamp says how busy it
was); simulated figures are virtual time and do not.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

if __package__ in (None, ""):       # run as a script: the repository root holds benchmarks/
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import figures, output, runs, stamp
from benchmarks.prefix_caching_text import section

NAME = "prefix_caching"
MOONCAKE = runs.SHAREGPT.parent / "mooncake_conversation_trace.jsonl.gz"
# Real engine, sized to finish in a few minutes on a shared 2-core machine: 6 turns of at
# most 128 prompt tokens, outputs forced to 8 tokens (the cache acts on prefill), a 20-block
# pool (320 tokens) that holds about two conversations, so the device cache evicts; a host
# tier of 128 blocks (about 75 MB).
CPU = {"model": "opt-125m", "num_prompts": 6, "rate": 2.0, "think": 0.5, "output_len": 8,
       "max_prompt_len": 128, "max_model_len": 160, "num_gpu_blocks": 20, "swap_gib": 1.0,
       "host_blocks": 128, "runs": 2}
CPU_QUICK = {**CPU, "num_prompts": 4, "runs": 1}
# Simulator: the first requests of the trace, each 512-token hash block scaled to 64 tokens so
# that prompts fit Llama-2-7B's 4,096-token context (mean prompt about 1,500 tokens); a host
# tier of all of 64 GiB of swap space (8,192 blocks of 8 MiB).
SIM = {"num_prompts": 1000, "block_tokens": 64, "ttft_slo_ms": 1000.0, "swap_gib": 64.0,
       "host_blocks": 8192, "scales": [1.0, 0.93, 0.86, 0.8], "workers": 3}
SIM_QUICK = {**SIM, "num_prompts": 40, "scales": [1.0]}
MODES = ("off", "device", "host")
POLICIES = ("vllm", "alise")


def mode_args(p: dict, mode: str) -> list[str]:
    caching = {"off": ["--no-prefix-caching"], "device": [],
               "host": ["--prefix-cache-host-blocks", str(p["host_blocks"])]}[mode]
    return ["--swap-space", f"{p['swap_gib']:g}", *caching]


def cpu_args(p: dict, mode: str, dataset: Path | None, result: Path) -> list[str]:
    data = ["--dataset-path", str(dataset)] if dataset else []
    return ["bench", "--model", p["model"], "--backends", "lenserve:vllm",
            "--dataset-name", "sharegpt-multiturn", *data, "--num-prompts", str(p["num_prompts"]),
            "--request-rate", f"{p['rate']:g}", "--think-time", f"{p['think']:g}",
            "--output-len", str(p["output_len"]), "--max-prompt-len", str(p["max_prompt_len"]),
            "--max-model-len", str(p["max_model_len"]), "--num-gpu-blocks",
            str(p["num_gpu_blocks"]), "--seed", "0", "--disable-tqdm", *mode_args(p, mode),
            "--result-json", output.rel(result)]


def sim_args(p: dict, policy: str, mode: str, scale: float, trace: Path,
             result: Path) -> list[str]:
    predictor = ["--predictor", "oracle"] if policy == "alise" else []
    return ["simulate", "--hardware", "a100-80g", "--model-shape", "llama-2-7b",
            "--backends", f"sim:{policy}", *predictor, "--dataset-name", "mooncake",
            "--dataset-path", str(trace), "--num-prompts", str(p["num_prompts"]),
            "--trace-timestamps", "--trace-time-scale", f"{scale:g}",
            "--trace-block-tokens", str(p["block_tokens"]), "--max-model-len", "4096",
            "--max-prompt-len", "4000", "--seed", "0", *mode_args(p, mode), "--disable-tqdm",
            "--result-json", output.rel(result)]


def run_cpu(p: dict, dataset: Path | None, raw: Path) -> tuple[list[dict], list[str]]:
    """The three modes back to back, the whole sequence ``runs`` times (interleaved)."""
    found, commands = [], []
    for i in range(p["runs"]):
        for mode in MODES:
            result = raw / f"cpu_{mode}_{i}.json"
            command = cpu_args(p, mode, dataset, result)
            wall = runs.lenserve(command, raw / f"cpu_{mode}_{i}.log")
            commands.append(runs.shown(command))
            found += [{**r, "mode": mode, "run": i, "wall_s": wall}
                      for r in runs.load_runs(result)]
    return found, commands


def run_sim(p: dict, trace: Path, raw: Path) -> tuple[list[dict], list[str]]:
    """Every (policy, mode, speed), ``workers`` simulations at a time (virtual time: how
    many run at once changes no figure)."""
    from concurrent.futures import ThreadPoolExecutor
    jobs = [(policy, mode, scale) for policy in POLICIES for mode in MODES
            for scale in p["scales"]]

    def one(job):
        policy, mode, scale = job
        result = raw / f"sim_{policy}_{mode}_{scale:g}.json"
        command = sim_args(p, policy, mode, scale, trace, result)
        runs.lenserve(command, raw / f"sim_{policy}_{mode}_{scale:g}.log")
        return runs.shown(command), [{**r, "mode": mode, "scale": scale,
                                      "request_rate": r["summary"]["request_throughput"]}
                                     for r in runs.load_runs(result)]

    with ThreadPoolExecutor(p["workers"]) as pool:
        done = list(pool.map(one, jobs))
    return [r for _, found in done for r in found], [command for command, _ in done]


def previous(out: output.Outputs) -> dict:
    """The last published record of this command (its parts not run again are kept)."""
    import json
    path = out.file(NAME, "json")
    return json.loads(path.read_text()) if path.exists() else {}


def kept(record: dict, key: str, command: str) -> tuple[list[dict], list[str]]:
    return (record.get(key, []),
            [c for c in record.get("lenserve_commands", []) if c.startswith(command)])


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


def plot(path: Path, sim: list[dict]) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    styles = {"off": ":", "device": "--", "host": "-"}
    for policy, marker in zip(POLICIES, "os"):
        for mode in MODES:
            pts = sorted((r["request_rate"], r["summary"]["ttft_ms"]["mean"]) for r in sim
                         if r["policy"] == policy and r["mode"] == mode)
            if pts:
                ax.plot(*zip(*pts), marker=marker, linestyle=styles[mode],
                        label=f"{policy}, caching {mode}")
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
                    help="which parts to run: sim (virtual time), cpu (the real engine), or "
                         "both (default %(default)s); a part not run keeps its runs from the "
                         "last published record, if any")
    ap.add_argument("--model", default="opt-125m",
                    help="model of the real-engine part (fake: the test double, no timing)")
    args = ap.parse_args(argv)
    trace = runs.dataset_file(args.trace)
    out = output.outputs(args, NAME)
    p, q = (CPU_QUICK, SIM_QUICK) if args.quick else (CPU, SIM)
    p = {**p, "model": args.model}
    start, t0 = stamp.take(), time.perf_counter()
    parts = {part for part in args.parts.split(",") if part}
    if not parts or parts - {"sim", "cpu"}:
        raise SystemExit(f"--parts takes sim, cpu or sim,cpu; got {args.parts!r}")
    sim, sim_commands = run_sim(q, trace, out.raw) if "sim" in parts else ([], [])
    cpu, cpu_commands = run_cpu(p, args.dataset_path, out.raw) if "cpu" in parts else ([], [])
    last = previous(out)            # read after the runs: the other part may have finished
    if "sim" not in parts:
        sim, sim_commands = kept(last, "sim_runs", "lenserve simulate")
    if "cpu" not in parts:
        cpu, cpu_commands = kept(last, "cpu_runs", "lenserve bench")
    ideal = (ideal_hit_rate(q, trace) if "sim" in parts
             else last.get("ideal_hit_rate", 0.0))
    run_stamp = stamp.finish(start, time.perf_counter() - t0)
    plot(out.file(NAME, "png"), sim)
    output.publish(out, NAME, section(cpu, sim, ideal, p, q, run_stamp), argv=argv,
                   commands=cpu_commands + sim_commands, stamp=run_stamp,
                   data={"params": {"cpu": p, "sim": q}, "ideal_hit_rate": ideal,
                         "cpu_runs": cpu, "sim_runs": sim})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
