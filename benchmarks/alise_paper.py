"""ALISE (paper 001) at its own setting, simulated: Figure 6 (normalized latency against
request rate, Alpaca and ShareGPT, ``orca``, ``vllm-v0``, ``vllm``, ``alise`` on the embedded
predictor, ``oracle``) and Figure 8 (ALISE's swapping against Recompute and Defer), on the
roofline of a V100-32GB with a PCIe 4.0 x16 host link serving OPT-13B (every number an
estimate), a KV pool of 400 blocks of 16 tokens (~5 GiB, what OPT-13B leaves on the card), a
16 GiB host tier kept in INT8 for every policy, as the paper runs them; the scheduler's CPU
time and the predictor's latency charged as measured (``services/simulator/data``). Then,
measured here: the real engine's upload waits per 1,000 iterations without and with ALISE's
uploads ahead of need, and ``lenserve bench-swap``'s link bytes with and without INT8.

    python3 benchmarks/alise_paper.py [--quick]
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

if __package__ in (None, ""):       # run as a script: the repository root holds benchmarks/
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import figures, output, runs, stamp, tables

NAME = "alise_paper"
DATA = runs.SHAREGPT.parent
HW, SHAPE, BLOCKS, HOST_GIB = "v100-32g", "opt-13b", 400, "16"
FIG6 = ("orca", "vllm-v0", "vllm", "oracle")
SLOS = [0.1, 0.2]           # s/token; the paper reads Figure 6 at a 200 ms constraint
GOALS = {"alpaca": 1.8, "sharegpt": 2.1}
FULL = {"alpaca": {"prompts": 900, "rates": [4, 8, 16, 24, 32, 48, 64]},
        "sharegpt": {"prompts": 600, "rates": [0.5, 1, 1.5, 2, 3, 4]},
        "real": {"prompts": 16, "rate": 4, "blocks": 48}, "swap_blocks": 40}
QUICK = {"alpaca": {"prompts": 24, "rates": [16, 64]},
         "sharegpt": {"prompts": 16, "rates": [1, 4]},
         "real": {"prompts": 6, "rate": 4, "blocks": 48}, "swap_blocks": 20}
PATHS = {"alpaca": DATA / "alpaca_data_1k_random_subset.json",
         "sharegpt": DATA / "sharegpt_v3_first_turn.jsonl.gz"}
FIG8 = (("ALISE (swap)", ()), ("Recompute", ("swap=false",)), ("Defer", ("preemption=false",)))


def simulate_args(dataset: str, params: dict, backends: tuple[str, ...], predictor: str,
                  result: Path, policy_config: tuple[str, ...] = ()) -> list[str]:
    d = params[dataset]
    return ["simulate", "--hardware", HW, "--model-shape", SHAPE,
            "--backends", ",".join(f"sim:{b}" for b in backends), "--predictor", predictor,
            "--dataset-name", dataset, "--dataset-path", str(PATHS[dataset]),
            "--num-prompts", str(d["prompts"]),
            "--sweep-rates", ",".join(f"{r:g}" for r in d["rates"]), "--seed", "0",
            "--num-gpu-blocks", str(BLOCKS), "--swap-space", HOST_GIB, "--kv-int8",
            "--disable-tqdm", "--result-json", output.rel(result),
            "--plot", output.rel(result.with_suffix(".png")),
            *(("--policy-config", *policy_config) if policy_config else ())]


def _run(args: list[str], raw: Path, label: str, commands: list[str],
         rename: dict[str, str] | None = None) -> list[dict]:
    runs.lenserve(args, raw / f"{label}.log")
    commands.append(runs.shown(args))
    found = runs.load_runs(raw / f"{label}.json", rename)
    for r, run in zip(found, json.loads((raw / f"{label}.json").read_text())["runs"]):
        r["dataset"] = label.split("_")[0]
        r["stats"] = {k: run["summary"].get(k) for k in (
            "num_preemptions", "num_iterations", "num_upload_waits", "num_uploads_ahead")}
    return found


def figure6(params: dict, raw: Path, commands: list[str]) -> list[dict]:
    found = []
    for dataset in ("alpaca", "sharegpt"):
        base = raw / f"{dataset}_baselines.json"
        found += _run(simulate_args(dataset, params, FIG6, "none", base), raw,
                      f"{dataset}_baselines", commands)
        ours = raw / f"{dataset}_alise.json"
        found += _run(simulate_args(dataset, params, ("alise",), "embedded", ours), raw,
                      f"{dataset}_alise", commands)
    return found


def figure8(params: dict, raw: Path, commands: list[str]) -> list[dict]:
    """On Alpaca with the true lengths, so only the memory protocol differs."""
    found = []
    for i, (label, config) in enumerate(FIG8):
        result = raw / f"alpaca_fig8_{i}.json"
        found += _run(simulate_args("alpaca", params, ("alise",), "oracle", result, config),
                      raw, f"alpaca_fig8_{i}", commands, {"alise": label})
    return found


def upload_waits(params: dict, raw: Path, commands: list[str]) -> list[dict]:
    """The real engine (opt-125m on this CPU, true lengths), ALISE with the old admit-then-
    wait path and with uploads ahead of need, a KV pool of a few mean requests."""
    p, rows = params["real"], []
    for ahead in ("false", "true"):
        result = raw / f"real_upload_ahead_{ahead}.json"
        args = ["bench", "--backends", "lenserve:alise", "--model", "opt-125m",
                "--predictor", "oracle", "--dataset-name", "sharegpt",
                "--dataset-path", str(PATHS["sharegpt"]), "--num-prompts", str(p["prompts"]),
                "--request-rate", str(p["rate"]), "--seed", "0", "--max-model-len", "256",
                "--num-gpu-blocks", str(p["blocks"]), "--swap-space", "1",
                "--policy-config", f"upload_ahead={ahead}", "swap_wait_s=0.5",
                "--disable-tqdm", "--result-json", output.rel(result)]
        runs.lenserve(args, raw / f"real_upload_ahead_{ahead}.log")
        commands.append(runs.shown(args))
        run = json.loads(result.read_text())["runs"][0]
        s = run["summary"]
        n = max(1, s.get("num_iterations") or 0)
        mean_len = (s["total_input_tokens"] + s["total_output_tokens"]) / max(
            1, s["completed"] if "completed" in s else s.get("successful_requests", 1))
        rows.append({"upload_ahead": ahead == "true", "iterations": s.get("num_iterations"),
                     "upload_waits": s.get("num_upload_waits"),
                     "uploads_ahead": s.get("num_uploads_ahead"),
                     "waits_per_1k": 1000 * (s.get("num_upload_waits") or 0) / n,
                     "output_tokens": s["total_output_tokens"],
                     "failed": s.get("failed", 0), "normalized_latency": s[tables.NL],
                     "pool_mean_requests": p["blocks"] * 16 / mean_len})
    return rows


def swap_bytes(params: dict, raw: Path, commands: list[str]) -> dict:
    result = raw / "bench_swap.json"
    args = ["bench-swap", "--model", "opt-125m", "--dtype", "bfloat16",
            "--num-blocks", str(params["swap_blocks"]), "--blocks-per-request", "10",
            "--repeats", "2", "--new-tokens", "12", "--swap-after", "4", "--device", "cpu",
            "--json", output.rel(result)]
    runs.lenserve(args, raw / "bench_swap.log")
    commands.append(runs.shown(args))
    return json.loads(result.read_text())


def sustained(found: list[dict], dataset: str, policy: str, slo: float) -> tuple[float, str]:
    return tables.sustained_rate(
        tables.nl_points([r for r in found if r["dataset"] == dataset], policy), slo)


def ratio_rows(found: list[dict]) -> tuple[list[str], dict]:
    rows, ratios = [], {}
    for dataset in ("alpaca", "sharegpt"):
        for slo in SLOS:
            a, an = sustained(found, dataset, "alise", slo)
            v, vn = sustained(found, dataset, "vllm-v0", slo)
            o, on = sustained(found, dataset, "oracle", slo)
            ratios[dataset, slo] = (a / v if v else float("nan"), a / o if o else float("nan"))
            note = ">=" if an == ">=" and vn != ">=" else ""
            rows.append([dataset, f"{slo:g}", f"{vn}{v:.2f}", f"{an}{a:.2f}", f"{on}{o:.2f}",
                         f"{note}{ratios[dataset, slo][0]:.2f}",
                         f"{GOALS[dataset]:g}", f"{ratios[dataset, slo][1]:.2f}"])
    head = ["dataset", "NL SLO (s/token)", "vllm-v0 (req/s)", "alise", "oracle",
            "alise / vllm-v0", "paper's goal", "alise / oracle (goal >= 0.85)"]
    return tables.markdown(head, rows), ratios


def nl_table(found: list[dict], dataset: str) -> list[str]:
    return tables.rate_table([r for r in found if r["dataset"] == dataset],
                             lambda s: s[tables.NL], "{:.4f}")


def real_table(rows: list[dict]) -> list[str]:
    return tables.markdown(
        ["path", "iterations", "upload waits", "uploads ahead", "waits / 1,000 iterations",
         "output tokens", "failed", "NL (s/token)"],
        [["uploads ahead (Alg. 2)" if r["upload_ahead"] else "admit, then wait",
          str(r["iterations"]), str(r["upload_waits"]), str(r["uploads_ahead"]),
          f"{r['waits_per_1k']:.1f}", str(r["output_tokens"]), str(r["failed"]),
          f"{r['normalized_latency']:.4f}"] for r in rows])


def swap_table(r: dict) -> list[str]:
    fp, q = r["fp"], r["int8"]
    return tables.markdown(
        ["host pool", "link bytes each way", "x fewer", "out+in (GB/s, this CPU)",
         "max error (steps)", "greedy tokens agreeing"],
        [["exact (bf16)", str(fp["link_bytes_each_way"]), "1.00", f"{fp['out_in_gbps']:.2f}",
          "0", f"{r['agreement']['fp']['token_agreement']:.0%}"],
         ["INT8 on the link", str(q["link_bytes_each_way"]),
          f"{fp['link_bytes_each_way'] / q['link_bytes_each_way']:.2f}",
          f"{q['out_in_gbps']:.2f}", f"{q['int8_max_error_in_steps']:.2f}",
          f"{r['agreement']['int8']['token_agreement']:.0%}"]])


def summary_text(ratios: dict, real: list[dict], params: dict) -> str:
    a, s = ratios["alpaca", 0.2], ratios["sharegpt", 0.2]
    old, new = real
    return (f"**Simulated figures are estimates**: the real serving core and policies on the "
            f"roofline of a V100-32GB (PCIe 4.0 x16 host link) serving OPT-13B, "
            f"{params['alpaca']['prompts']} Alpaca and {params['sharegpt']['prompts']} "
            f"ShareGPT requests per rate (Poisson, seed 0), {BLOCKS} KV blocks of 16 tokens, a "
            f"{HOST_GIB} GiB INT8 host tier for every policy, the scheduler's CPU time and the "
            f"embedded predictor's latency charged as measured on this machine. At NL <= 0.2 "
            f"s/token `alise` sustains {a[0]:.2f}x `vllm-v0`'s rate on Alpaca (paper: 1.8x) "
            f"and {s[0]:.2f}x on ShareGPT (paper: 2.1x), {a[1]:.2f}x and {s[1]:.2f}x "
            f"`oracle`'s. The real engine (opt-125m on this CPU, a pool of "
            f"{old['pool_mean_requests']:.1f} mean requests) waited for "
            f"{old['waits_per_1k']:.1f} uploads per 1,000 iterations admitting swapped "
            f"requests, {new['waits_per_1k']:.1f} uploading them ahead of need.")


def plot(path: Path, found: list[dict]) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from benchmarks.figures import MARKERS
    panels = [("alpaca", "Fig. 6: Alpaca"), ("sharegpt", "Fig. 6: ShareGPT"),
              ("fig8", "Fig. 8: Alpaca, memory protocols")]
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    for ax, (key, title) in zip(axes, panels):
        part = [r for r in found if r.get("panel", r["dataset"]) == key]
        for i, name in enumerate(tables.policies(part)):
            pts = sorted((r["request_rate"], r["summary"][tables.NL]) for r in part
                         if r["policy"] == name)
            ax.plot(*zip(*pts), marker=MARKERS[i], label=name, markersize=4)
        ax.set_yscale("log")
        ax.set_title(f"{title} (OPT-13B, V100, simulated)", fontsize=8)
        ax.set_xlabel("request rate (req/s)")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=6)
    axes[0].set_ylabel("normalized latency (s/token)")
    figures.save(fig, path)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = output.parser(__doc__).parse_args(argv)
    for path in PATHS.values():
        runs.dataset_file(path)
    out, params = output.outputs(args, NAME), QUICK if args.quick else FULL
    out.raw.mkdir(parents=True, exist_ok=True)
    start, t0, commands = stamp.take(), time.perf_counter(), []
    fig6 = figure6(params, out.raw, commands)
    fig8 = figure8(params, out.raw, commands)
    for r in fig8:
        r["panel"] = "fig8"
    real = upload_waits(params, out.raw, commands)
    swap = swap_bytes(params, out.raw, commands)
    plot(out.file(NAME, "png"), fig6 + fig8)
    ratio_lines, ratios = ratio_rows(fig6)
    section = output.Section(
        title="ALISE at the paper's setting (Fig. 6, Fig. 8; simulated) and its KV path",
        text=summary_text(ratios, real, params),
        tables=[("Sustained rate under a normalized-latency SLO (interpolated; `>=`: alise "
                 "met it at every tested rate, so the ratio is a lower bound)", ratio_lines),
                ("Fig. 6, Alpaca: normalized latency (s/token)", nl_table(fig6, "alpaca")),
                ("Fig. 6, ShareGPT: normalized latency (s/token)", nl_table(fig6, "sharegpt")),
                ("Fig. 8, Alpaca, true lengths: normalized latency (s/token)",
                 tables.rate_table(fig8, lambda s: s[tables.NL], "{:.4f}")),
                ("Real engine: upload waits (opt-125m, this CPU, one run each)",
                 real_table(real)),
                ("`bench-swap`: host-link bytes (opt-125m shape, bf16, this CPU)",
                 swap_table(swap))],
        figure_alt="normalized latency vs request rate: Fig. 6 Alpaca and ShareGPT, Fig. 8")
    output.publish(out, NAME, section, argv=argv, commands=commands,
                   stamp=stamp.finish(start, time.perf_counter() - t0),
                   data={"params": {**params, "hardware": HW, "model_shape": SHAPE,
                                    "num_gpu_blocks": BLOCKS, "slos": SLOS},
                         "ratios": {f"{d}@{s:g}": v for (d, s), v in ratios.items()},
                         "fig6": fig6, "fig8": fig8, "real_upload_waits": real,
                         "bench_swap": swap})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
