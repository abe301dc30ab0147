"""Token identity with Hugging Face ``generate``: every model family preset on every attention
backend. Each preset is initialised by Hugging Face with a fixed seed, saved as a checkpoint,
run greedily by ``generate`` (the reference) and served by lenserve's engine from the saved
directory (chunked prefill beside decodes, 8-token blocks). Not a timing figure: a cell says
how many prompts came out token for token identical.

    python3 benchmarks/model_families.py [--quick] [--device cuda]

On a CPU the Triton backend runs in Triton's interpreter (set before anything imports triton).
"""
from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):       # run as a script: the repository root holds benchmarks/
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

NAME = "model_families"
FULL = {"max_tokens": 6}
# Quick: the family whose kernels differ most (window, soft-capping), two prompts.
QUICK = {"max_tokens": 3, "presets": ["gemma2-tiny"]}


def _presets() -> list[str]:
    from services.executor.models.presets import FAMILY_PRESETS
    return ["llama-tiny", *FAMILY_PRESETS]


def table(rows: list[dict], backends: list[str]) -> list[str]:
    from benchmarks import tables
    from services.executor.models.presets import PRESETS

    by = {(r["preset"], r["backend"]): r for r in rows}
    out = []
    for preset in dict.fromkeys(r["preset"] for r in rows):
        cells = []
        for b in backends:
            r = by.get((preset, b))
            cells.append("-" if r is None else
                         f"{r['identical']}/{r['prompts']}" + ("" if r["ok"] else " **differs**"))
        out.append([f"`{preset}`", by[preset, backends[0]]["model_type"], *cells,
                    PRESETS[preset].description])
    return tables.markdown(["preset", "model_type", *backends, "what it exercises"], out)


def summary_text(rows: list[dict], params: dict, device: str) -> str:
    bad = [r for r in rows if not r["ok"]]
    verdict = ("Every cell is identical." if not bad else
               f"{len(bad)} of {len(rows)} cells differ: " + "; ".join(
                   f"{r['preset']} on {r['backend']}: {r['first_divergence']}" for r in bad))
    interp = (" Triton ran in its interpreter on the CPU tensors." if device == "cpu" else "")
    return (f"Greedy tokens of lenserve against Hugging Face `generate` (float32, {device}), "
            f"{params['max_tokens']} new tokens for each of {rows[0]['prompts']} prompts of "
            f"{', '.join(map(str, params['prompt_lens']))} tokens, lengths chosen to reach past "
            f"the presets' sliding windows (24, 40) and their RoPE scalings' original context "
            f"(64). Weights are random (seeded), so this checks the forward pass, not output "
            f"quality.{interp} {verdict}")


def plot(path: Path, rows: list[dict], backends: list[str]) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from benchmarks import figures
    presets = list(dict.fromkeys(r["preset"] for r in rows))
    by = {(r["preset"], r["backend"]): r for r in rows}
    fig, ax = plt.subplots(figsize=(1.6 + 1.2 * len(backends), 0.8 + 0.35 * len(presets)))
    for i, preset in enumerate(presets):
        for j, b in enumerate(backends):
            r = by.get((preset, b))
            color = "#dddddd" if r is None else ("#9be39b" if r["ok"] else "#f08a8a")
            ax.add_patch(plt.Rectangle((j, i), 1, 1, color=color, ec="white"))
            if r is not None:
                ax.text(j + 0.5, i + 0.5, f"{r['identical']}/{r['prompts']}", ha="center",
                        va="center", fontsize=8)
    ax.set_xlim(0, len(backends))
    ax.set_ylim(len(presets), 0)
    ax.set_xticks([j + 0.5 for j in range(len(backends))], backends, fontsize=8)
    ax.set_yticks([i + 0.5 for i in range(len(presets))], presets, fontsize=8)
    ax.set_title("prompts token-identical with HF generate", fontsize=9)
    ax.tick_params(length=0)
    figures.save(fig, path)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    from benchmarks import output
    ap = output.parser(__doc__)
    ap.add_argument("--device", default="cpu", help="cpu, or cuda: compiled Triton kernels")
    args = ap.parse_args(argv)
    if args.device == "cpu":
        # Before torch or transformers import triton, which fixes the mode then.
        os.environ.setdefault("TRITON_INTERPRET", "1")
    from benchmarks import stamp
    from lenserve.bench.families import PROMPT_LENS, QUICK_PROMPT_LENS, check_families

    name = NAME if args.device == "cpu" else f"{NAME}_cuda"
    out = output.outputs(args, name)
    params = dict(QUICK if args.quick else FULL)
    params["prompt_lens"] = list(QUICK_PROMPT_LENS if args.quick else PROMPT_LENS)
    presets = params.pop("presets", None) or _presets()
    backends = ["torch", "cpu", "triton"] if args.device == "cpu" else ["torch", "triton"]
    start, t0 = stamp.take(), time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        rows = [r.to_dict() for r in check_families(
            presets, backends, Path(tmp), lens=params["prompt_lens"],
            max_tokens=params["max_tokens"], device=args.device)]
    run_stamp = stamp.finish(start, time.perf_counter() - t0)
    plot(out.file(name, "png"), rows, backends)
    call = (f"lenserve.bench.families.check_families({presets}, {backends}, "
            f"lens={params['prompt_lens']}, max_tokens={params['max_tokens']}, "
            f"device={args.device!r})")
    section = output.Section(
        title=f"Model families: token identity with Hugging Face ({args.device})",
        text=summary_text(rows, params, args.device),
        tables=[("Prompts token-identical with HF generate, by family preset and attention "
                 "backend", table(rows, backends))],
        figure_alt="grid of family presets by attention backend, identical prompts per cell")
    output.publish(out, name, section, argv=argv, commands=[call], stamp=run_stamp,
                   data={"params": {**params, "presets": presets, "backends": backends},
                         "rows": rows, "failures": sum(not r["ok"] for r in rows)})
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
