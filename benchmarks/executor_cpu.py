"""One executor iteration on this CPU: ``lenserve bench-executor --model opt-125m`` (random
weights), prefill and decode tokens/s at the batch sizes it runs, and the decode floor it
computes from the measured copy bandwidth.

    python3 benchmarks/executor_cpu.py [--quick]
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

if __package__ in (None, ""):       # run as a script: the repository root holds benchmarks/
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import figures, output, runs, stamp, tables

NAME = "executor_cpu"
FULL = {"batch_sizes": "1,8,32,128", "repeats": 3}
QUICK = {"batch_sizes": "1,2", "repeats": 1}


def executor_args(params: dict, result: Path) -> list[str]:
    return ["bench-executor", "--model", "opt-125m", "--batch-sizes", params["batch_sizes"],
            "--repeats", str(params["repeats"]), "--json", output.rel(result)]


def table(result: dict) -> list[str]:
    rows = [[str(r["batch_size"]), f"{r['prefill_tokens_per_s']:.0f}",
             f"{r['prefill_s'] * 1e3:.1f}", f"{r['decode_tokens_per_s']:.0f}",
             f"{r['decode_s'] * 1e3:.1f}", f"{r['decode_floor_s'] * 1e3:.2f}",
             f"{r['decode_s'] / r['decode_floor_s']:.1f}"] for r in result["rows"]]
    return tables.markdown(["batch", "prefill tok/s", "prefill ms", "decode tok/s",
                            "decode ms", "decode floor ms", "x floor"], rows)


def summary_text(result: dict, run_stamp: dict) -> str:
    rows = result["rows"]
    best = max(rows, key=lambda r: r["decode_tokens_per_s"])
    shared = (" The CPU was shared with other work during the run (see the stamp), so these "
              "are likely lower than the same machine gives idle."
              if stamp.cpu_was_shared(run_stamp) else "")
    return (f"One engine iteration of {result['model']} ({result['dtype']}, attention "
            f"`{result['attention_backend']}`, {result['cpu_threads']} CPU threads), random "
            f"weights: prefill of {result['prompt_len']}-token prompts and one decode step at "
            f"context {result['context_len']}, each the median of the command's repeats. "
            f"Decode peaks at {best['decode_tokens_per_s']:.0f} tok/s (batch "
            f"{best['batch_size']}); the floor is the time to read the weights and the batch's "
            f"KV once at the copy bandwidth the command measured "
            f"({result['copy_bandwidth_bytes_per_s'] / 1e9:.1f} GB/s), a bound, not a "
            f"measurement.{shared}")


def plot(path: Path, result: dict) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    batches = [r["batch_size"] for r in result["rows"]]
    fig, ax = plt.subplots(figsize=(6, 4))
    for key, label in (("prefill_tokens_per_s", "prefill"), ("decode_tokens_per_s", "decode"),
                       ("decode_floor_tokens_per_s", "decode floor (bound)")):
        ax.plot(batches, [r[key] for r in result["rows"]], marker="o", label=label,
                linestyle="--" if "floor" in key else "-")
    ax.set_xscale("log", base=2)
    ax.set_xticks(batches, [str(b) for b in batches])
    ax.minorticks_off()
    ax.set_yscale("log")
    ax.set_xlabel("batch size (sequences)")
    ax.set_ylabel("tokens/s")
    ax.set_title(f"{result['model']} executor iteration on this CPU (measured)", fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    figures.save(fig, path)


def section(result: dict, run_stamp: dict) -> output.Section:
    return output.Section(title="Executor iteration (this CPU, opt-125m)",
                          text=summary_text(result, run_stamp),
                          tables=[("Tokens/s of one iteration by batch size", table(result))],
                          figure_alt="prefill and decode tokens/s vs batch size on a CPU")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = output.parser(__doc__)
    args = ap.parse_args(argv)
    out, params = output.outputs(args, NAME), QUICK if args.quick else FULL
    start, t0 = stamp.take(), time.perf_counter()
    raw = out.raw / "bench_executor.json"
    command = executor_args(params, raw)
    runs.lenserve(command, out.raw / "bench_executor.log")
    result = json.loads(raw.read_text())
    run_stamp = stamp.finish(start, time.perf_counter() - t0)
    plot(out.file(NAME, "png"), result)
    output.publish(out, NAME, section(result, run_stamp), argv=argv,
                   commands=[runs.shown(command)], stamp=run_stamp,
                   data={"params": params, "result": result})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
