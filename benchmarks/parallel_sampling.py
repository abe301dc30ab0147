"""Cost of ``n = 4`` (parallel sampling on one prefill) against four separate ``n = 1``
requests of the same prompt sent together, on the real engine (opt-125m, random weights,
in-process executor, this CPU). Each round runs both back to back, in alternating order, on
fresh prompts (nothing cached from an earlier case); a case counts the prompt tokens the
executor computed (every token it was fed, less one per decode step) and the wall time from
adding the requests to the last token. Two rounds at least: the page gives each figure's
min-max over the rounds.

    python3 benchmarks/parallel_sampling.py [--quick] [--rounds N]
"""
from __future__ import annotations

import random
import sys
import time
from pathlib import Path

if __package__ in (None, ""):       # run as a script: the repository root holds benchmarks/
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import figures, output, stamp, tables

NAME = "parallel_sampling"
FULL = {"model": "opt-125m", "n": 4, "prompt_len": 500, "max_tokens": 32, "rounds": 2}
QUICK = {"model": "opt-tiny", "n": 4, "prompt_len": 40, "max_tokens": 4, "rounds": 2}
CASES = ("n=4", "4 x n=1")


def build_engine(params: dict):
    from lenserve.engine.llm_engine import EngineConfig, LLMEngine
    from services.executor.runner import InProcessExecutor

    length = params["prompt_len"] + params["max_tokens"]
    blocks = params["n"] * 2 * (-(-length // 16)) + 16
    executor = InProcessExecutor(params["model"], num_gpu_blocks=blocks, block_size=16,
                                 max_model_len=length + 16)
    config = EngineConfig(model=params["model"], max_model_len=length + 16,
                          num_gpu_blocks=blocks,
                          max_num_batched_tokens=params["n"] * params["prompt_len"] + 64)
    return LLMEngine(config, executor=executor), executor


def run_case(engine, executor, case: str, params: dict, tag: str, rng: random.Random) -> dict:
    from lenserve_contract.sampling_params import SamplingParams
    vocab = executor.model_info().vocab_size
    prompt = [rng.randrange(1000, vocab - 1) for _ in range(params["prompt_len"])]
    n, out_len = params["n"], params["max_tokens"]
    sp = dict(max_tokens=out_len, ignore_eos=True, detokenize=False, seed=rng.randrange(1 << 30))
    fed, execute = [0], executor.execute

    def counted(batch):
        fed[0] += sum(len(s.token_ids) for s in batch.sequences)
        return execute(batch)
    executor.execute = counted
    t0 = time.perf_counter()
    try:
        if case == "n=4":
            engine.add_request(tag, prompt_token_ids=prompt, sampling_params=SamplingParams(
                n=n, **sp))
        else:
            for i in range(n):
                engine.add_request(f"{tag}-{i}", prompt_token_ids=prompt,
                                   sampling_params=SamplingParams(**sp))
        tokens = 0
        while engine.has_unfinished_requests():
            for out in engine.step():
                tokens += sum(len(c.token_ids) for c in out.outputs) if out.finished else 0
        wall = time.perf_counter() - t0
    finally:
        executor.execute = execute
    assert tokens == n * out_len, f"{case}: {tokens} output tokens, wanted {n * out_len}"
    return {"prefill_tokens": fed[0] - n * (out_len - 1), "wall_s": wall}


def measure(params: dict) -> dict:
    engine, executor = build_engine(params)
    rng = random.Random(0)
    run_case(engine, executor, "n=4", {**params, "max_tokens": 2}, "warm", rng)
    rounds = []
    for r in range(params["rounds"]):
        order = CASES if r % 2 == 0 else CASES[::-1]
        rounds.append({case: run_case(engine, executor, case, params, f"r{r}-{k}", rng)
                       for k, case in enumerate(order)})
    info = executor.model_info()
    return {"model": info.name, "dtype": info.dtype, "rounds": rounds}


def spread(result: dict, case: str, key: str) -> tuple[float, float]:
    values = [r[case][key] for r in result["rounds"]]
    return min(values), max(values)


def ratio(result: dict, key: str) -> tuple[float, float]:
    values = [r["n=4"][key] / r["4 x n=1"][key] for r in result["rounds"]]
    return min(values), max(values)


def table(result: dict) -> list[str]:
    rows = []
    for case in CASES:
        lo, hi = spread(result, case, "prefill_tokens")
        wlo, whi = spread(result, case, "wall_s")
        rows.append([case, f"{lo:.0f}" if lo == hi else f"{lo:.0f}-{hi:.0f}",
                     f"{wlo:.2f}-{whi:.2f}"])
    plo, phi = ratio(result, "prefill_tokens")
    tlo, thi = ratio(result, "wall_s")
    rows.append(["ratio n=4 / 4 x n=1", f"{plo:.3f}-{phi:.3f}", f"{tlo:.2f}-{thi:.2f}"])
    return tables.markdown(["case", "prompt tokens computed", "wall s"], rows)


def summary_text(result: dict, params: dict, run_stamp: dict) -> str:
    plo, phi = ratio(result, "prefill_tokens")
    tlo, thi = ratio(result, "wall_s")
    shared = (" The CPU was shared with other work during the run (see the stamp), so the "
              "times move between rounds; the token counts do not."
              if stamp.cpu_was_shared(run_stamp) else "")
    return (f"One prompt of {params['prompt_len']} tokens, {params['n']} samples of "
            f"{params['max_tokens']} tokens each, {result['model']} ({result['dtype']}, random "
            f"weights) on this CPU: one request with `n={params['n']}` against "
            f"{params['n']} requests with `n=1` sent together, {len(result['rounds'])} rounds "
            f"with both back to back. `n={params['n']}` computes {plo:.2f}-{phi:.2f}x the "
            f"prompt tokens (the prompt's full blocks once, then each sample recomputes the "
            f"last partial block) and takes {tlo:.2f}-{thi:.2f}x the wall time.{shared}")


def plot(path: Path, result: dict) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(7, 3.2))
    for ax, key, label in zip(axes, ("prefill_tokens", "wall_s"),
                              ("prompt tokens computed", "wall time (s)")):
        highs = [spread(result, c, key)[1] for c in CASES]
        lows = [spread(result, c, key)[0] for c in CASES]
        ax.bar(range(len(CASES)), highs, 0.6, alpha=0.6)
        ax.scatter(range(len(CASES)), lows, marker="_", s=300, color="k")
        ax.set_xticks(range(len(CASES)), CASES)
        ax.set_ylabel(label)
        ax.grid(True, axis="y", alpha=0.3)
    fig.suptitle(f"{result['model']}: n=4 vs four n=1 (measured; bar max, tick min)",
                 fontsize=9)
    figures.save(fig, path)


def section(result: dict, params: dict, run_stamp: dict) -> output.Section:
    return output.Section(
        title=f"Parallel sampling: n=4 against four n=1 requests (this CPU, {result['model']})",
        text=summary_text(result, params, run_stamp),
        tables=[("Prompt tokens computed and wall time (min-max over rounds)", table(result))],
        figure_alt="prompt tokens computed and wall time of n=4 and of four n=1 requests")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = output.parser(__doc__)
    ap.add_argument("--rounds", type=int, default=None, help="rounds (at least 2)")
    ap.add_argument("--threads", type=int, default=1, help="CPU intra-op threads")
    args = ap.parse_args(argv)
    out = output.outputs(args, NAME)
    params = dict(QUICK if args.quick else FULL)
    params["rounds"] = max(2, args.rounds or params["rounds"])
    import torch
    torch.set_num_threads(args.threads)
    start, t0 = stamp.take(), time.perf_counter()
    result = measure(params)
    run_stamp = stamp.finish(start, time.perf_counter() - t0)
    plot(out.file(NAME, "png"), result)
    output.publish(out, NAME, section(result, params, run_stamp), argv=argv,
                   commands=["(in-process: services.executor.runner.InProcessExecutor)"],
                   stamp=run_stamp, data={"params": params, "result": result})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
