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

NAME = "prefix_caching"
MOONCAKE = runs.SHAREGPT.parent / "mooncake_conversation_trace.jsonl.gz"
CONVERSATIONS = runs.SHAREGPT.parent / "sharegpt_v3_conversations_first17671.jsonl.gz"
# Real engine, sized to finish in a few minutes on an idle 2-core machine: 16 turns of 8
# conversations of the bundled ShareGPT sample (prompts up to 512 tokens, about 190 on
# average, a quarter of their tokens an earlier turn's prompt), outputs forced to 16 tokens
# (the cache acts on prefill), conversations starting at 2/s with 3 s of think time. A
# 34-block device pool (544 tokens, just over the longest request), so a conversation's
# blocks are evicted while it thinks: replayed by ``lenserve simulate`` on the bundled
# opt-125m CPU profile, the device cache serves 4% of prompt tokens and the host tier brings
# it to 15% (of 24% ideal). A host tier of 256 blocks (about 150 MB of bfloat16 KV, every
# block the run computes).
CPU = {"model": "opt-125m", "num_prompts": 16, "rate": 2.0, "think": 3.0, "output_len": 16,
       "max_prompt_len": 512, "max_model_len": 528, "num_gpu_blocks": 34, "swap_gib": 0.25,
       "host_blocks": 256, "runs": 2}
CPU_QUICK = {**CPU, "num_prompts": 4, "max_prompt_len": 256, "max_model_len": 272,
             "num_gpu_blocks": 24, "runs": 1}
# Simulator: the first requests of the trace, each 512-token hash block scaled to 64 tokens so
# that prompts fit Llama-2-7B's 4,096-token context (mean prompt about 1,500 tokens); a host
# tier of all of 64 GiB of swap space (8,192 blocks of 8 MiB).
SIM = {"num_prompts": 1000, "block_tokens": 64, "ttft_slo_ms": 1000.0, "swap_gib": 64.0,
       "host_blocks": 8192, "scales": [1.0, 0.93, 0.86, 0.8], "workers": 3}
SIM_QUICK = {**SIM, "num_prompts": 12, "scales": [1.0]}
# Simulator on multi-turn ShareGPT (the conversations file, or the bundled sample without
# it): 1,000 turns, conversations starting at 4-6/s with 5 s of think time (about 700-token
# prompts, 58% of their tokens cached when nothing is evicted), at and past the rate where
# the KV pool starts to evict and preempt.
CHAT = {"num_prompts": 1000, "think": 5.0, "max_prompt_len": 3072, "max_model_len": 4096,
        "swap_gib": 64.0, "host_blocks": 8192, "rates": [4.0, 5.0, 6.0], "workers": 3}
CHAT_QUICK = {**CHAT, "num_prompts": 12, "rates": [4.0]}
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


def chat_args(p: dict, policy: str, mode: str, rate: float, dataset: Path | None,
              result: Path) -> list[str]:
    predictor = ["--predictor", "oracle"] if policy == "alise" else []
    data = ["--dataset-path", str(dataset)] if dataset else []
    return ["simulate", "--hardware", "a100-80g", "--model-shape", "llama-2-7b",
            "--backends", f"sim:{policy}", *predictor, "--dataset-name", "sharegpt-multiturn",
            *data, "--num-prompts", str(p["num_prompts"]), "--request-rate", f"{rate:g}",
            "--think-time", f"{p['think']:g}", "--max-model-len", str(p["max_model_len"]),
            "--max-prompt-len", str(p["max_prompt_len"]), "--seed", "0", *mode_args(p, mode),
            "--disable-tqdm", "--result-json", output.rel(result)]


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


def run_sims(jobs: list[tuple[str, list[str], dict]], raw: Path,
             workers: int) -> tuple[list[dict], list[str]]:
    """Simulations ``(name, command, fields added to its runs)``, ``workers`` at a time
    (virtual time: how many run at once changes no figure)."""
    from concurrent.futures import ThreadPoolExecutor

    def one(job):
        name, command, fields = job
        runs.lenserve(command, raw / f"{name}.log")
        return runs.shown(command), [
            {**r, **fields, "request_rate": r["summary"]["request_throughput"]}
            for r in runs.load_runs(raw / f"{name}.json")]

    with ThreadPoolExecutor(workers) as pool:
        done = list(pool.map(one, jobs))
    return [r for _, found in done for r in found], [command for command, _ in done]


def run_sim(p: dict, trace: Path, raw: Path) -> tuple[list[dict], list[str]]:
    """The Mooncake trace: every (policy, mode, speed)."""
    jobs = [(name, sim_args(p, policy, mode, scale, trace, raw / f"{name}.json"),
             {"mode": mode, "scale": scale})
            for policy in POLICIES for mode in MODES for scale in p["scales"]
            for name in [f"sim_{policy}_{mode}_{scale:g}"]]
    return run_sims(jobs, raw, p["workers"])


def run_chat(p: dict, dataset: Path | None, raw: Path) -> tuple[list[dict], list[str]]:
    """Multi-turn ShareGPT: every (policy, mode, conversation rate)."""
    jobs = [(name, chat_args(p, policy, mode, rate, dataset, raw / f"{name}.json"),
             {"mode": mode, "conversation_rate": rate})
            for policy in POLICIES for mode in MODES for rate in p["rates"]
            for name in [f"chat_{policy}_{mode}_{rate:g}"]]
    return run_sims(jobs, raw, p["workers"])


def previous(out: output.Outputs) -> dict:
    """The last published record of this command (its parts not run again are kept)."""
    import json
    path = out.file(NAME, "json")
    return json.loads(path.read_text()) if path.exists() else {}


def kept(record: dict, key: str, command: str, dataset: str) -> tuple[list[dict], list[str]]:
    return (record.get(key, []),
            [c for c in record.get("lenserve_commands", [])
             if c.startswith(command) and f"--dataset-name {dataset} " in c])


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


def plot(path: Path, sim: list[dict], chat: list[dict]) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    styles = {"off": ":", "device": "--", "host": "-"}
    titles = ("Mooncake conversation trace", "multi-turn ShareGPT")
    for ax, found, title in zip(axes, (sim, chat), titles):
        for policy, marker in zip(POLICIES, "os"):
            for mode in MODES:
                pts = sorted((r["request_rate"], r["summary"]["ttft_ms"]["mean"])
                             for r in found if r["policy"] == policy and r["mode"] == mode)
                if pts:
                    ax.plot(*zip(*pts), marker=marker, linestyle=styles[mode],
                            label=f"{policy}, caching {mode}")
        ax.set_xlabel("served request rate (req/s)")
        ax.set_ylabel("mean TTFT (ms)")
        ax.set_yscale("log")
        ax.set_title(f"{title}, simulated A100/Llama-2-7B (estimates)", fontsize=9)
        ax.grid(True, alpha=0.3)
        if found:
            ax.legend(fontsize=7)
    figures.save(fig, path)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = output.parser(__doc__, dataset="ShareGPT conversations file for both multi-turn "
                       "parts (default: the real engine reads the sample bundled with "
                       f"lenserve, the simulator {CONVERSATIONS.name} beside the checkout if "
                       "there, else that sample; --quick: the bundled sample)")
    ap.add_argument("--trace", type=Path, default=MOONCAKE,
                    help="Mooncake conversation trace (default: %(default)s)")
    ap.add_argument("--parts", default="sim,chat,cpu",
                    help="which parts to run, comma-separated: sim (the Mooncake trace, "
                         "simulated), chat (multi-turn ShareGPT, simulated), cpu (the real "
                         "engine) (default %(default)s); a part not run keeps its runs (and "
                         "their settings) from the last published record, if any; none: "
                         "only re-make the page from that record")
    ap.add_argument("--model", default="opt-125m",
                    help="model of the real-engine part (fake: the test double, no timing)")
    args = ap.parse_args(argv)
    trace = runs.dataset_file(args.trace)
    out = output.outputs(args, NAME)
    p, q, c = (CPU_QUICK, SIM_QUICK, CHAT_QUICK) if args.quick else (CPU, SIM, CHAT)
    p = {**p, "model": args.model}
    if args.model == "fake":    # its blocks are bytes: a real model's swap space is millions
        p["swap_gib"] = 2**-14  # of them, which the host pool's allocator scans per copy
    start, t0 = stamp.take(), time.perf_counter()
    parts = {part for part in args.parts.split(",") if part} - {"none"}
    if parts - {"sim", "chat", "cpu"} or not (parts or args.parts == "none"):
        raise SystemExit(f"--parts takes some of sim, chat, cpu, or none; got {args.parts!r}")
    conversations = args.dataset_path
    if conversations is None and not args.quick and CONVERSATIONS.is_file():
        conversations = CONVERSATIONS
    sim, sim_commands = run_sim(q, trace, out.raw) if "sim" in parts else ([], [])
    chat, chat_commands = (run_chat(c, conversations, out.raw) if "chat" in parts
                           else ([], []))
    cpu, cpu_commands = (run_cpu(p, args.dataset_path, out.raw) if "cpu" in parts
                         else ([], []))
    last = previous(out)            # read after the runs: the other part may have finished
    params = last.get("params", {})
    if "sim" not in parts:
        sim, sim_commands = kept(last, "sim_runs", "lenserve simulate", "mooncake")
        q = params.get("sim", q)
    if "chat" not in parts:
        chat, chat_commands = kept(last, "chat_runs", "lenserve simulate",
                                   "sharegpt-multiturn")
        c = params.get("chat", c)
    if "cpu" not in parts and params.get("cpu") == p:   # runs made at other settings go
        cpu, cpu_commands = kept(last, "cpu_runs", "lenserve bench", "sharegpt-multiturn")
    ideal = (ideal_hit_rate(q, trace) if "sim" in parts
             else last.get("ideal_hit_rate", 0.0))
    run_stamp = stamp.finish(start, time.perf_counter() - t0)
    # Whether the CPU was shared is a property of the run that timed the real engine.
    cpu_stamp = run_stamp if "cpu" in parts else last.get("cpu_stamp", last.get("stamp"))
    from benchmarks.prefix_caching_text import section
    plot(out.file(NAME, "png"), sim, chat)
    output.publish(out, NAME, section(cpu, sim, chat, ideal, (p, q, c), cpu_stamp or run_stamp),
                   argv=argv, commands=cpu_commands + sim_commands + chat_commands,
                   stamp=run_stamp, data={"params": {"cpu": p, "sim": q, "chat": c},
                                          "ideal_hit_rate": ideal, "cpu_stamp": cpu_stamp,
                                          "cpu_runs": cpu, "sim_runs": sim, "chat_runs": chat})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
