"""Cost of a decode step with the sampling features, in one run: plain greedy, greedy with
presence / frequency / repetition penalties and 5 top logprobs, and greedy under a JSON-schema
grammar mask (xgrammar), at batch 1 and 64, on the in-process executor (opt-125m, random
weights, this CPU). One engine per mode gets the same requests and the engines step in turn,
so the i-th decode steps of the modes run back to back in one machine state; a step's cost is
the executor's own time for the iteration (``IterationTimings.total_s``). A mode's overhead
is the median over step pairs of its step over greedy's (the machine's drift, which moved
whole rounds by 10-40% on a shared VM, cancels in a pair), and, as before, the ratio of the
fastest steps. Two rounds at least: the page gives the min-max over rounds, and the JSON
keeps every step's time and its sampling part.

    python3 benchmarks/sampling_cost.py [--quick] [--rounds N] [--steps N]
"""
from __future__ import annotations

import json
import shlex
import sys
import time
from pathlib import Path

if __package__ in (None, ""):       # run as a script: the repository root holds benchmarks/
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import figures, output, stamp, tables

NAME = "sampling_cost"
FULL = {"model": "opt-125m", "batch_sizes": [1, 64], "rounds": 3, "steps": 30, "prompt_len": 32}
QUICK = {"model": "opt-tiny", "batch_sizes": [1, 4], "rounds": 2, "steps": 3, "prompt_len": 8}
SCHEMA = {"type": "object", "required": ["answer", "notes"], "additionalProperties": False,
          "properties": {"answer": {"type": "string"},
                         "notes": {"type": "array", "items": {"type": "string"}}}}
MODES = ("greedy", "penalties+logprobs", "json_schema")


def mode_params(mode: str, max_tokens: int):
    from lenserve_contract.sampling_params import SamplingParams, StructuredOutput
    base = dict(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, detokenize=False)
    if mode == "penalties+logprobs":
        return SamplingParams(presence_penalty=0.5, frequency_penalty=0.5,
                              repetition_penalty=1.1, logprobs=5, **base)
    if mode == "json_schema":
        return SamplingParams(structured_output=StructuredOutput("json_schema",
                                                                 json.dumps(SCHEMA)), **base)
    return SamplingParams(**base)


def build_engine(params: dict):
    from lenserve.engine.llm_engine import EngineConfig, LLMEngine
    from services.executor.runner import InProcessExecutor

    batch, length = max(params["batch_sizes"]), params["prompt_len"] + params["steps"] + 2
    blocks = max(batch * (-(-length // 16)) + 8, 256 // 16 + 1)
    executor = InProcessExecutor(params["model"], num_gpu_blocks=blocks, block_size=16,
                                 max_model_len=256)
    config = EngineConfig(model=params["model"], max_model_len=256, num_gpu_blocks=blocks,
                          max_num_batched_tokens=max(2048, batch * params["prompt_len"]))
    return LLMEngine(config, executor=executor), executor


def add_batch(engine, executor, mode: str, batch: int, params: dict, tag: str) -> None:
    import random
    rng = random.Random(batch)      # the same prompts in every mode
    vocab = executor.model_info().vocab_size
    sp = mode_params(mode, params["steps"] + 1)
    for i in range(batch):
        engine.add_request(f"{tag}-{i}", prompt_token_ids=[rng.randrange(1000, vocab - 1)
                                                           for _ in range(params["prompt_len"])],
                           sampling_params=sp)


def record_decode_steps(executor, batch: int, steps: list) -> None:
    """Wrap ``executor.execute``: each decode iteration of all ``batch`` requests appends
    (executor seconds, sampling seconds, thread CPU seconds) to ``steps``."""
    execute = executor.execute

    def timed(inp):
        start = time.thread_time()
        out = execute(inp)
        if len(inp.sequences) == batch and all(len(s.token_ids) == 1 for s in inp.sequences):
            steps.append((out.timings.total_s, out.timings.sample_s,
                          time.thread_time() - start))
        return out
    executor.execute = timed


def paired_round(engines: dict, batch: int, params: dict, tag: str) -> dict[str, list]:
    """One round at ``batch``: every mode's engine gets the same requests and the engines
    step in turn (greedy, penalties+logprobs, json_schema, greedy, ...), so the i-th decode
    steps of the modes ran within a few hundred ms of each other, in one machine state.
    Returns each mode's decode steps in order."""
    steps: dict[str, list] = {m: [] for m in engines}
    saved = {}
    for m, (engine, executor) in engines.items():
        add_batch(engine, executor, m, batch, params, f"{tag}-{m}")
        saved[m] = executor.execute
        record_decode_steps(executor, batch, steps[m])
    try:
        while any(e.has_unfinished_requests() for e, _ in engines.values()):
            for engine, _ in engines.values():
                if engine.has_unfinished_requests():
                    engine.step()
    finally:
        for m, (_, executor) in engines.items():
            executor.execute = saved[m]
    return steps


def paired_ratio(steps: dict[str, list], mode: str) -> float:
    """The median over step pairs of (the mode's step / greedy's step of the same turn)."""
    pairs = sorted(a[0] / b[0] for a, b in zip(steps[mode], steps["greedy"]))
    return pairs[len(pairs) // 2]


def measure(params: dict) -> dict:
    """Per round, batch and mode: the fastest step's executor seconds (``rounds``), the least
    thread CPU seconds of a step (``rounds_cpu``: the time the step computed, without the
    time it waited for a core other work held) and the median paired ratio to greedy
    (``paired``)."""
    engines = {m: build_engine(params) for m in MODES}      # one engine (and executor) a mode
    paired_round(engines, 1, {**params, "steps": 2}, "warm")
    rounds, rounds_cpu, paired, steps = [], [], [], {}
    for r in range(params["rounds"]):
        got = {str(b): paired_round(engines, b, params, f"{r}-{b}")
               for b in params["batch_sizes"]}
        for b, modes in got.items():
            for m, st in modes.items():
                steps.setdefault(f"{b}/{m}", []).extend((t, s) for t, s, _ in st)
        rounds.append({b: {m: min(t for t, _, _ in st) for m, st in modes.items()}
                       for b, modes in got.items()})
        rounds_cpu.append({b: {m: min(c for _, _, c in st) for m, st in modes.items()}
                           for b, modes in got.items()})
        paired.append({b: {m: paired_ratio(modes, m) for m in MODES}
                       for b, modes in got.items()})
    info = engines["greedy"][1].model_info()
    return {"model": info.name, "dtype": info.dtype, "attention_backend": info.attention_backend,
            "rounds": rounds, "rounds_cpu": rounds_cpu, "paired": paired,
            "steps_total_and_sample_s": steps}


def ratios(result: dict, batch: int, mode: str, key: str = "rounds") -> list[float]:
    if key == "paired":
        return [r[str(batch)][mode] for r in result.get(key, ())]
    return [r[str(batch)][mode] / r[str(batch)]["greedy"] for r in result.get(key, ())]


def span(rs: list[float]) -> str:
    return f"{(min(rs) - 1) * 100:+.1f}% to {(max(rs) - 1) * 100:+.1f}%" if rs else "-"


def sampling_ms(result: dict, batch: int, mode: str) -> float:
    """Median of the sampling part of the mode's steps (the sampler's own time, measured
    inside each iteration: far less exposed to other work than the whole step)."""
    parts = sorted(sample for _, sample in result["steps_total_and_sample_s"][f"{batch}/{mode}"])
    return parts[len(parts) // 2] * 1e3


def added_share(result: dict, batch: int, mode: str) -> float:
    """The mode's added sampling time as a share of the fastest greedy step."""
    greedy = min(r[str(batch)]["greedy"] for r in result["rounds"]) * 1e3
    return (sampling_ms(result, batch, mode) - sampling_ms(result, batch, "greedy")) / greedy


def table(result: dict, batch_sizes: list[int]) -> list[str]:
    rows = []
    for b in batch_sizes:
        ms = {m: [r[str(b)][m] * 1e3 for r in result["rounds"]] for m in MODES}
        row = [str(b)] + [f"{min(ms[m]):.1f}-{max(ms[m]):.1f}" for m in MODES]
        row += [span(ratios(result, b, m, "paired")) for m in MODES[1:]]
        row += [span(ratios(result, b, m)) for m in MODES[1:]]
        row += [span(ratios(result, b, m, "rounds_cpu")) for m in MODES[1:]]
        row += [" / ".join(f"{sampling_ms(result, b, m):.2f}" for m in MODES)]
        row += [f"{added_share(result, b, m) * 100:+.1f}%" for m in MODES[1:]]
        rows.append(row)
    return tables.markdown(["batch", "greedy ms", "penalties+logprobs ms", "json_schema ms",
                            "pen+lp vs greedy, paired steps", "json vs greedy, paired steps",
                            "pen+lp vs greedy, fastest steps", "json vs greedy, fastest steps",
                            "pen+lp vs greedy, CPU time", "json vs greedy, CPU time",
                            "sampling ms (greedy / pen+lp / json)",
                            "pen+lp added sampling / step", "json added sampling / step"],
                           rows)


def summary_text(result: dict, params: dict, run_stamp: dict) -> str:
    bs = params["batch_sizes"]
    pen = "penalties+logprobs"
    paired = {b: ratios(result, b, pen, "paired") for b in bs}
    fastest = max(max(ratios(result, b, pen)) for b in bs)
    added = max(added_share(result, b, pen) for b in bs)
    shared = (" The CPU was shared with other work during the run (see the stamp)."
              if stamp.cpu_was_shared(run_stamp) else "")
    per_batch = "; ".join(f"batch {b}: {span(rs)}" for b, rs in paired.items() if rs)
    return (f"One decode step of {result['model']} ({result['dtype']}, random weights, "
            f"attention `{result['attention_backend']}`, {params.get('threads', 1)} thread) on "
            f"this CPU, executor time. One engine per mode, the same requests in each, the "
            f"engines stepping in turn, so the i-th steps of the modes ran back to back; "
            f"{params['steps']} decode steps per mode and round, {params['rounds']} rounds, "
            f"ranges min-max over the rounds. Penalties (presence, frequency, repetition) with "
            f"5 top logprobs against plain greedy, the median over step pairs: {per_batch} "
            f"(the aim is under 5%). The sampling time they add is at most {added * 100:+.1f}% "
            f"of a greedy step; the fastest step of each mode in a round differs by at most "
            f"{(fastest - 1) * 100:+.1f}% (a minimum over steps that ran seconds apart, so "
            f"more exposed to the machine's drift). The JSON-schema mask fills one bitmask per "
            f"request on the host each step.{shared}")


def plot(path: Path, result: dict, batch_sizes: list[int]) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    width = 0.35
    for k, mode in enumerate(MODES[1:]):
        lows = [(min(ratios(result, b, mode)) - 1) * 100 for b in batch_sizes]
        highs = [(max(ratios(result, b, mode)) - 1) * 100 for b in batch_sizes]
        xs = [i + (k - 0.5) * width for i in range(len(batch_sizes))]
        ax.bar(xs, highs, width, label=f"{mode} (max)", alpha=0.5)
        ax.scatter(xs, lows, marker="_", s=200, color="k")
    ax.axhline(5, linestyle="--", color="gray", linewidth=1, label="5% aim")
    ax.set_xticks(range(len(batch_sizes)), [f"batch {b}" for b in batch_sizes])
    ax.set_ylabel("decode step overhead vs greedy (%)")
    ax.set_title(f"{result['model']} sampling cost on this CPU (measured; tick = min round)",
                 fontsize=9)
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=7)
    figures.save(fig, path)


def section(result: dict, params: dict, run_stamp: dict) -> output.Section:
    return output.Section(
        title=f"Sampling cost per decode step (this CPU, {result['model']})",
        text=summary_text(result, params, run_stamp),
        tables=[("Executor ms per decode step and overhead vs greedy (min-max over rounds)",
                 table(result, params["batch_sizes"]))],
        figure_alt="decode step overhead of penalties+logprobs and a JSON-schema mask vs greedy")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = output.parser(__doc__)
    ap.add_argument("--rounds", type=int, default=None, help="rounds (at least 2)")
    ap.add_argument("--steps", type=int, default=None, help="decode steps per mode and round")
    ap.add_argument("--from-json", type=Path, default=None,
                    help="re-make the section from a run's JSON (no measuring)")
    ap.add_argument("--threads", type=int, default=1,
                    help="CPU intra-op threads (1: no thread thrash on a shared machine)")
    args = ap.parse_args(argv)
    out = output.outputs(args, NAME)
    params = dict(QUICK if args.quick else FULL)
    params["rounds"] = max(2, args.rounds or params["rounds"])
    params["steps"] = args.steps or params["steps"]
    params["threads"] = args.threads
    import torch
    torch.set_num_threads(args.threads)
    if args.from_json:
        saved = json.loads(args.from_json.read_text())
        params, result, run_stamp = saved["params"], saved["result"], saved["stamp"]
        argv = shlex.split(saved["command"])[2:]    # the page names the run that measured
    else:
        start, t0 = stamp.take(), time.perf_counter()
        result = measure(params)
        run_stamp = stamp.finish(start, time.perf_counter() - t0)
    plot(out.file(NAME, "png"), result, params["batch_sizes"])
    output.publish(out, NAME, section(result, params, run_stamp), argv=argv,
                   commands=["(in-process: services.executor.runner.InProcessExecutor)"],
                   stamp=run_stamp, data={"params": params, "result": result})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
