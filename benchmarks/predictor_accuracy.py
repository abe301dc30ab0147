"""The embedded length predictor's accuracy on held-out ShareGPT prompts: ``lenserve predictor
eval`` on one train/test split, ALISE (stock MiniLM, retrieval + MLP, as ``--predictor
embedded`` runs it) against the baselines the command computes, and ALISE with its encoder
fine-tuned on the training prompts' lengths (as ``lenserve predictor build`` does by default
with 2,000 records or more).

    python3 benchmarks/predictor_accuracy.py [--quick] [--dataset-path FILE] [--proxy-epochs N]
                                             [--finetune-epochs N]

``predictor eval`` prints its table and writes no JSON, so its rows are read back from the
printed table (``parse_table``): the figures are the command's own, to its printed precision.
"""
from __future__ import annotations

import re
import sys
import time
from pathlib import Path

if __package__ in (None, ""):       # run as a script: the repository root holds benchmarks/
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import figures, output, runs, stamp, tables

NAME = "predictor_accuracy"
# 2,000 training records: the size of the embedded predictor's bundled seed.
FULL = {"num_train": 2000, "num_test": 500}
QUICK = {"num_train": 60, "num_test": 20}
COLUMNS = ("acc", "meanRE", "medRE", "tau", "rho", "under", "upper⊇", "p50ms", "p99ms",
           "b32/s", "ms/p")
_NUMBER = r"(?:-?\d+(?:\.\d+)?|nan|-?inf)"
# A row: the method (which may hold spaces), one number per column, then a free-text note.
_ROW = re.compile(rf"^(?P<method>.+?)\s+"
                  rf"(?P<numbers>{_NUMBER}(?:\s+{_NUMBER}){{{len(COLUMNS) - 1}}})"
                  rf"(?:\s+(?P<note>.*))?$")


def eval_args(params: dict, dataset: Path, proxy_epochs: int,
              finetune_epochs: int = 0) -> list[str]:
    return ["predictor", "eval", "--dataset-name", "sharegpt", "--dataset-path", str(dataset),
            "--num-train", str(params["num_train"]), "--num-test", str(params["num_test"]),
            "--finetune-epochs", str(finetune_epochs), "--proxy-epochs", str(proxy_epochs),
            "--seed", "0"]


def parse_table(text: str) -> list[dict]:
    """The rows of the table ``predictor eval`` prints: a header starting ``method`` with the
    columns of ``COLUMNS``, one line per method, ended by the ``p50/p99:`` legend."""
    lines = text.splitlines()
    head = next((i for i, line in enumerate(lines) if line.split()[:1] == ["method"]), None)
    if head is None or tuple(lines[head].split()[1:1 + len(COLUMNS)]) != COLUMNS:
        raise ValueError(f"predictor eval printed no table with the columns {COLUMNS}; has "
                         f"its output format changed?")
    rows = []
    for line in lines[head + 1:]:
        if line.startswith("p50/p99"):
            break
        m = _ROW.match(line.strip())
        if m is None:
            raise ValueError(f"unreadable row of the predictor eval table: {line!r}")
        values = [float(x) for x in m.group("numbers").split()]
        rows.append({"method": m.group("method"), **dict(zip(COLUMNS, values)),
                     "note": m.group("note") or ""})
    if not rows:
        raise ValueError("the predictor eval table has no rows")
    return rows


def table(rows: list[dict]) -> list[str]:
    return tables.markdown(
        ["method", "bucket accuracy", "median relative error", "Kendall tau", "Spearman",
         "ms/prompt (batches of 32)"],
        [[r["method"], f"{r['acc']:.3f}", f"{r['medRE']:.3f}", f"{r['tau']:.3f}",
          f"{r['rho']:.3f}", "-" if r["ms/p"] != r["ms/p"] else f"{r['ms/p']:.1f}"]
         for r in rows])


def summary_text(rows: list[dict], params: dict, proxy_epochs: int, run_stamp: dict) -> str:
    by = {r["method"]: r for r in rows}
    alise, mean = by.get("ALISE"), by.get("global mean")
    versus = ""
    if alise and mean:
        versus = (f" ALISE's median relative error is {alise['medRE']:.3f} against "
                  f"{mean['medRE']:.3f} for always predicting the training mean, and its "
                  f"Kendall tau {alise['tau']:.3f} (the mean ranks nothing: 0).")
    shared = (" The CPU was shared with other work during the run (see the stamp), which "
              "inflates the per-prompt times, not the accuracy." if stamp.cpu_was_shared(run_stamp)
              else "")
    before = by.get("ALISE, MLP alone below s0")
    if alise and before:
        versus += (f" Below ALISE's similarity threshold the MLP's answer is averaged with the "
                   f"mean log length of the 32 nearest records (`wide_k`, `wide_weight`): "
                   f"Spearman {before['rho']:.3f} -> {alise['rho']:.3f}, Kendall "
                   f"{before['tau']:.3f} -> {alise['tau']:.3f} against the MLP alone there.")
    encoder = by.get("ALISE + tuned encoder")
    if alise and encoder:
        versus += (f" With its encoder fine-tuned on the training prompts' lengths (as "
                   f"`lenserve predictor build` does with 2,000 records or more) ALISE reaches "
                   f"Spearman {encoder['rho']:.3f}, Kendall {encoder['tau']:.3f} and a median "
                   f"relative error of {encoder['medRE']:.3f}.")
    tuned = by.get("proxy (MiniLM fine-tuned)")
    proxy = (f" The proxy baseline (S3's: MiniLM fine-tuned on the training prompts' lengths, "
             f"{proxy_epochs} epoch{'s' if proxy_epochs > 1 else ''}) reaches "
             f"{tuned['medRE']:.3f} and {tuned['tau']:.3f}." if tuned else
             " The fine-tuned proxy baseline (S3's) was left out (`--proxy-epochs 0`).")
    return (f"`lenserve predictor eval` on one random split of ShareGPT, "
            f"{params['num_train']:,} training and {params['num_test']:,} held-out prompts (split "
            f"seed 0), output lengths in MiniLM tokens: ALISE as `--predictor embedded` runs it "
            f"(stock all-MiniLM-L6-v2 encoder, retrieval of similar prompts with an MLP "
            f"fallback), against the command's baselines; retrieval-only and MLP-only are "
            f"ALISE's two halves alone.{versus}{proxy} One split: another moves the third "
            f"decimal and sometimes the second.{shared}")


def plot(path: Path, rows: list[dict]) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r["method"] for r in rows]
    fig, axes = plt.subplots(1, 2, figsize=(8, 3.5))
    for ax, key, label in ((axes[0], "medRE", "median relative error (lower is better)"),
                           (axes[1], "tau", "Kendall tau (higher is better)")):
        ax.barh(names, [r[key] for r in rows])
        ax.set_xlabel(label, fontsize=8)
        ax.invert_yaxis()
        ax.tick_params(labelsize=7)
        ax.grid(True, axis="x", alpha=0.3)
    fig.suptitle("Output-length prediction on held-out ShareGPT prompts (measured)", fontsize=9)
    figures.save(fig, path)


def section(rows: list[dict], params: dict, proxy_epochs: int,
            run_stamp: dict) -> output.Section:
    return output.Section(title="Length predictor accuracy (held-out ShareGPT)",
                          text=summary_text(rows, params, proxy_epochs, run_stamp),
                          tables=[("Predicted against true output length", table(rows))],
                          figure_alt="median relative error and Kendall tau per predictor")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = output.parser(__doc__, dataset="ShareGPT file (default: %(default)s)",
                       dataset_default=runs.SHAREGPT)
    ap.add_argument("--proxy-epochs", type=int, default=1,
                    help="epochs of the fine-tuned proxy baseline, which fine-tunes MiniLM on "
                         "the training prompts (about a minute per epoch on an idle 2-core CPU, "
                         "ten times that on a busy one); 0 leaves it out")
    ap.add_argument("--finetune-epochs", type=int, default=None,
                    help="epochs of ALISE's encoder fine-tune, its rows beside the stock "
                         "encoder's (default 2; 0 with --quick, whose few records it needs "
                         "not); 0 leaves them out")
    args = ap.parse_args(argv)
    if args.finetune_epochs is None:
        args.finetune_epochs = 0 if args.quick else 2
    dataset = runs.dataset_file(args.dataset_path)
    out, params = output.outputs(args, NAME), QUICK if args.quick else FULL
    start, t0 = stamp.take(), time.perf_counter()
    command = eval_args(params, dataset, args.proxy_epochs, args.finetune_epochs)
    log = out.raw / "predictor_eval.log"
    runs.lenserve(command, log)
    rows = parse_table(log.read_text())
    run_stamp = stamp.finish(start, time.perf_counter() - t0)
    plot(out.file(NAME, "png"), rows)
    output.publish(out, NAME, section(rows, params, args.proxy_epochs, run_stamp), argv=argv,
                   commands=[runs.shown(command)], stamp=run_stamp,
                   data={"params": {**params, "proxy_epochs": args.proxy_epochs,
                                    "finetune_epochs": args.finetune_epochs,
                                    "dataset": output.rel(dataset)}, "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
