"""ALISE's KV path and its ordering on a GPU (measured): ``lenserve bench-swap`` out+in
bandwidth against the device's own host link (one pinned copy of the same bytes each way), exact
and INT8, with the INT8 codec one layer per pass (the code before) and several layers per pass;
then the real engine, smollm-360m (random weights, bf16, CUDA graphs), ``vllm`` against
``alise`` on ShareGPT with a KV pool of 400 blocks of 16 tokens (6,400 tokens: what OPT-13B's
~5 GB of KV holds on the paper's V100) and an INT8 host tier, and ``alise`` without uploads
ahead of need at one rate (upload waits per 1,000 iterations, before and after).

    python3 benchmarks/alise_gpu.py [--quick] [--dataset-path FILE] [--device cuda]
                                    [--budget-s S] [--reuse-raw]

``alise`` ranks by the true output lengths times exp(N(0, 0.58)): the embedded predictor's
error on ShareGPT (``alise_runs.NOISE``), without its encoder and vector DB, which a GPU host
need not have. ``--budget-s`` bounds the serving runs: a rate not started within it is left out
(the page says which). Needs a CUDA device unless ``--device cpu`` (a check of the command,
not a figure).
"""
from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

if __package__ in (None, ""):       # run as a script: the repository root holds benchmarks/
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import figures, output, runs, stamp, tables

NAME = "alise_gpu"
SIGMA = 0.58            # the embedded predictor's log-normal error (alise_runs.NOISE)
NO_AHEAD = "alise (no uploads ahead)"
FULL = {"swap": {"model": "smollm-360m", "cases": [("bfloat16", 2000, 100),
                                                   ("bfloat16", 2000, 16)], "repeats": 3},
        "serve": {"model": "smollm-360m", "dtype": "bfloat16", "prompts": 200,
                  "rates": [16, 8, 32], "blocks": 400, "max_model_len": 2048,
                  "swap_gib": 8, "no_ahead_rate": 16}}
QUICK = {"swap": {"model": "opt-125m", "cases": [("float32", 40, 10)], "repeats": 2},
         "serve": {"model": "opt-125m", "dtype": "float32", "prompts": 6, "rates": [4],
                   "blocks": 40, "max_model_len": 256, "swap_gib": 1, "no_ahead_rate": 4}}


def swap_runs(params: dict, device: str, raw: Path, commands: list[str]) -> list[dict]:
    p, found = params["swap"], []
    for dtype, blocks, per_request in p["cases"]:
        for layers in (1, None):
            tag = f"swap_{dtype}_{blocks}x{per_request}_{layers or 'chunked'}"
            args = ["bench-swap", "--model", p["model"], "--dtype", dtype, "--device", device,
                    "--num-blocks", str(blocks), "--blocks-per-request", str(per_request),
                    "--repeats", str(p["repeats"]), "--json", output.rel(raw / f"{tag}.json"),
                    *(("--codec-layers", str(layers)) if layers else ())]
            if not (raw / f"{tag}.json").is_file():
                runs.lenserve(args, raw / f"{tag}.log")
            commands.append(runs.shown(args))
            found.append(json.loads((raw / f"{tag}.json").read_text()))
    return found


def serve_args(s: dict, device: str, backends: str, rate: float, result: Path,
               policy_config: tuple[str, ...] = ()) -> list[str]:
    return ["bench", "--backends", backends, "--model", s["model"], "--device", device,
            "--dtype", s["dtype"], "--dataset-name", "sharegpt", "--dataset-path", "DATASET",
            "--num-prompts", str(s["prompts"]), "--request-rate", f"{rate:g}", "--seed", "0",
            "--max-model-len", str(s["max_model_len"]), "--num-gpu-blocks", str(s["blocks"]),
            "--swap-space", str(s["swap_gib"]), "--kv-int8", "--predictor",
            f"oracle:{SIGMA:g}:0", "--max-num-seqs", "64", "--disable-tqdm",
            "--result-json", output.rel(result),
            *(("--policy-config", *policy_config) if policy_config else ())]


def serve_runs(params: dict, device: str, dataset: Path, raw: Path, commands: list[str],
               deadline: float) -> tuple[list[dict], list[str]]:
    """``vllm`` and ``alise`` at each rate (one bench per rate, so a run cut short loses one
    rate), then ``alise`` with ``upload_ahead=false``; what the deadline leaves out is named."""
    s, found, skipped = params["serve"], [], []
    plan = [(r, "lenserve:vllm,lenserve:alise", (), f"serve_{r:g}") for r in s["rates"]]
    plan.append((s["no_ahead_rate"], "lenserve:alise", ("upload_ahead=false",),
                 f"serve_{s['no_ahead_rate']:g}_no_ahead"))
    for rate, backends, config, tag in plan:
        result = raw / f"{tag}.json"
        args = serve_args(s, device, backends, rate, result, config)
        args[args.index("DATASET")] = str(dataset)
        if not result.is_file():
            if time.monotonic() > deadline:
                skipped.append(f"{backends} {' '.join(config)} at {rate:g} req/s".strip())
                continue
            runs.lenserve(args, raw / f"{tag}.log")
        commands.append(runs.shown(args))
        found += [{**r, "policy": NO_AHEAD if config else r["policy"]}
                  for r in runs.load_runs(result)]
    return found, skipped


def swap_table(found: list[dict]) -> list[str]:
    rows, cases = [], set()
    for r in found:
        case = f"{r['dtype']}, {r['num_blocks']} blocks, requests of {r['blocks_per_request']}"
        # the exact path does not depend on the codec: its first run per case stands for it
        keys = ("int8",) if case in cases else ("fp", "int8")
        cases.add(case)
        for key in keys:
            t = r[key]
            rows.append([case, "exact" if key == "fp" else "INT8",
                         "-" if key == "fp" else ("1" if r.get("codec_layers") else "chunked"),
                         f"{r['raw']['out_in_gbps']:.1f}", f"{t['out_gbps']:.1f}",
                         f"{t['in_gbps']:.1f}", f"{t['out_in_gbps']:.1f}",
                         f"{t['ratio_to_raw']:.2f}",
                         f"{r['swapped_bytes'] / max(1, t['link_bytes_each_way']):.2f}"])
    return tables.markdown(["swapped", "path", "codec layers per pass", "host link (GB/s)",
                            "out (GB/s)", "in (GB/s)", "out+in (GB/s)", "x host link",
                            "device bytes / link bytes"], rows)


def serve_table(found: list[dict]) -> list[str]:
    rows = []
    for r in sorted(found, key=lambda r: (r["request_rate"], r["policy"])):
        s = r["summary"]
        base = next((x["summary"][tables.NL] for x in found if x["policy"] == "vllm"
                     and x["request_rate"] == r["request_rate"]), math.nan)
        n = max(1, s.get("num_iterations") or 1)
        rows.append([f"{r['request_rate']:g}", r["policy"],
                     tables.with_failures(f"{s[tables.NL] * 1e3:.2f}", s),
                     f"{base / s[tables.NL]:.2f}", f"{s['ttft_ms']['mean']:.0f}",
                     f"{s['ttft_ms']['p99']:.0f}", f"{s['jct_ms']['mean'] / 1e3:.2f}",
                     f"{s.get('num_preemptions', 0):.0f}",
                     f"{1000 * (s.get('num_upload_waits') or 0) / n:.1f}",
                     f"{s.get('num_uploads_ahead') or 0:.0f}", f"{n}",
                     f"{1e3 * s['duration_s'] / n:.2f}", f"{s['output_throughput']:.0f}"])
    return tables.markdown(["rate (req/s)", "policy", "NL (ms/token)", "vllm NL / NL",
                            "mean TTFT (ms)", "P99 TTFT (ms)", "mean JCT (s)", "preemptions",
                            "upload waits / 1k iterations", "uploads ahead", "iterations",
                            "ms per iteration", "output tok/s"], rows)


def plot(path: Path, serve: list[dict], swap: list[dict]) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.5))
    for policy in sorted({r["policy"] for r in serve}):
        pts = sorted((r["request_rate"], r["summary"][tables.NL] * 1e3) for r in serve
                     if r["policy"] == policy)
        if pts:
            a.plot(*zip(*pts), marker="o", label=policy)
    a.set_xlabel("request rate (req/s)")
    a.set_ylabel("normalized latency (ms/token)")
    a.set_title("smollm-360m, ShareGPT, 400 blocks of 16", fontsize=9)
    a.legend(fontsize=7)
    labels, values = [], []
    for r in swap:
        case = f"{r['dtype'][:4]} x{r['blocks_per_request']}"
        if r.get("codec_layers"):
            labels += [f"{case}\nlink", f"{case}\nexact", f"{case}\nINT8 1"]
            values += [r["raw"]["out_in_gbps"], r["fp"]["out_in_gbps"], r["int8"]["out_in_gbps"]]
        else:
            labels.append(f"{case}\nINT8 n")
            values.append(r["int8"]["out_in_gbps"])
    b.bar(range(len(values)), values)
    b.set_xticks(range(len(values)), labels, fontsize=6)
    b.set_ylabel("out+in GB/s (of device bytes)")
    b.set_title("bench-swap", fontsize=9)
    figures.save(fig, path)


def summary_text(serve: list[dict], swap: list[dict], skipped: list[str], where: str) -> str:
    parts = [f"Measured on {where}, one run each."]
    for r in swap:
        if r.get("codec_layers") is None:
            exact = sorted(x["fp"]["ratio_to_raw"] for x in swap
                           if (x["dtype"], x["num_blocks"], x["blocks_per_request"])
                           == (r["dtype"], r["num_blocks"], r["blocks_per_request"]))
            parts.append(f"`bench-swap` {r['dtype']} in requests of {r['blocks_per_request']} "
                         f"blocks: host link {r['raw']['out_in_gbps']:.1f} GB/s out+in, exact "
                         f"swaps {exact[0]:.2f}-{exact[-1]:.2f}x of it (its two runs), INT8 "
                         f"{r['int8']['ratio_to_raw']:.2f}x (in device bytes per second).")
    if any(r["int8"]["out_in_gbps"] < r["fp"]["out_in_gbps"] for r in swap):
        parts.append("Where INT8 trails the exact copy, the link is not what bounds it: the "
                     "codec and the host-side packing of its bytes are; INT8 then buys host "
                     "capacity (the host tier holds the device-bytes / link-bytes ratio more "
                     "requests), not swap time.")
    by = {(r["request_rate"], r["policy"]): r["summary"][tables.NL] for r in serve}
    ratios = [f"{by[rate, 'vllm'] / by[rate, 'alise']:.2f}x at {rate:g} req/s"
              for rate, p in sorted(by) if p == "alise" and (rate, "vllm") in by]
    if ratios:
        parts.append("`alise`'s normalized latency against `vllm`'s: " + ", ".join(ratios) + ".")
    off = next((r for r in serve if r["policy"] == NO_AHEAD), None)
    on = next((r for r in serve if r["policy"] == "alise" and off
               and r["request_rate"] == off["request_rate"]), None)
    if off and on:
        per_1k = [1000 * (r["summary"].get("num_upload_waits") or 0)
                  / max(1, r["summary"].get("num_iterations") or 1) for r in (off, on)]
        parts.append(f"Uploads ahead of need at {on['request_rate']:g} req/s: upload waits per "
                     f"1,000 iterations {per_1k[0]:.1f} -> {per_1k[1]:.1f}, normalized latency "
                     f"{off['summary'][tables.NL] * 1e3:.2f} -> "
                     f"{on['summary'][tables.NL] * 1e3:.2f} ms/token.")
    if skipped:
        parts.append("Left out by the time budget: " + "; ".join(skipped) + ".")
    return " ".join(parts)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = output.parser(__doc__, dataset="ShareGPT file (default: %(default)s)",
                       dataset_default=runs.SHAREGPT)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--budget-s", type=float, default=300.0,
                    help="seconds for the serving runs: a run not started by then is left out")
    ap.add_argument("--reuse-raw", action="store_true",
                    help="publish from the result files an earlier run left in --raw")
    args = ap.parse_args(argv)
    dataset = runs.dataset_file(args.dataset_path)
    out, params = output.outputs(args, NAME), QUICK if args.quick else FULL
    if not args.reuse_raw:
        import torch
        if args.device == "cuda" and not torch.cuda.is_available():
            raise SystemExit("alise_gpu needs a CUDA device (or --device cpu to check the "
                             "command)")
        for stale in out.raw.glob("*.json") if out.raw.is_dir() else ():
            stale.unlink()
    out.raw.mkdir(parents=True, exist_ok=True)
    start, t0, commands = stamp.take(), time.perf_counter(), []
    swap = swap_runs(params, args.device, out.raw, commands)
    serve, skipped = serve_runs(params, args.device, dataset, out.raw, commands,
                                time.monotonic() + args.budget_s)
    plot(out.file(NAME, "png"), serve, swap)
    section = output.Section(
        title="ALISE's KV path and ordering on a GPU (measured)",
        text=summary_text(serve, swap, skipped,
                          stamp.gpu_name() if args.device == "cuda" else "this CPU"),
        tables=[("`bench-swap`: out+in bandwidth of the device's bytes against the host link "
                 "(median of the repeats)", swap_table(swap)),
                (f"Real engine: `vllm` and `alise` ({params['serve']['model']}, ShareGPT, "
                 f"{params['serve']['prompts']} requests per rate, KV pool of "
                 f"{params['serve']['blocks']} blocks of 16, INT8 host tier)", serve_table(serve))],
        figure_alt="normalized latency vs rate (vllm, alise); bench-swap bandwidths")
    output.publish(out, NAME, section, argv=argv, commands=commands,
                   stamp=stamp.finish(start, time.perf_counter() - t0),
                   data={"params": params, "device": args.device, "sigma": SIGMA,
                         "skipped": skipped, "swap": swap, "serve": serve})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
