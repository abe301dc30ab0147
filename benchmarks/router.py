"""Replicas behind the router: the three placement policies against each other.

    python3 benchmarks/router.py [--quick] [--dataset-path FILE] [--skip-real]

Simulated (``benchmarks/router_simulated.py``): 8 and 16 A100-80GB replicas serving
Llama-2-7B, ShareGPT, ``vllm`` and ``alise`` inside the replicas, each router policy over a
rate sweep; the highest rate each sustains under a P99 TTFT target and a normalized-latency
target; and one run of 100,000 requests on 16 replicas, with its wall time. Real
(``benchmarks/router_real.py``): three opt-125m replicas on this machine, each router at a
loaded rate, the router hop's added latency, and the replica-kill drill; two runs.
"""
from __future__ import annotations

import math
import sys
import time
from pathlib import Path

if __package__ in (None, ""):       # run as a script: the repository root holds benchmarks/
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import output, router_real, router_simulated, runs, stamp, tables  # noqa: E402

NAME = "router"
REAL = {"num": 18, "rate": 2.0, "runs": 2}
REAL_QUICK = {"num": 6, "rate": 4.0, "runs": 1}


def real_rows(real: dict) -> list[list[str]]:
    """Per router: min-max over the runs of mean and P99 TTFT, NL, and failures."""
    rows = []
    for router in router_real.ROUTERS:
        got = [r["summary"] for r in real["loaded"] if r["router"] == router]

        def span(key, scale=1.0, fmt="{:.0f}"):
            vals = [key(s) * scale for s in got]
            return fmt.format(min(vals)) + "-" + fmt.format(max(vals))
        rows.append([router, span(lambda s: s["ttft_ms"]["mean"]),
                     span(lambda s: s["ttft_ms"]["p99"]),
                     span(lambda s: s[tables.NL], fmt="{:.3f}"),
                     str(sum(s["failed"] for s in got))])
    return rows


def summary_text(rows: list[dict], scale: dict | None, real: dict | None) -> str:
    gains = []
    for replicas in sorted({r["replicas"] for r in rows}):
        for inner in router_simulated.INNER:
            for key, what in (("p99_ttft<=1s", "P99 TTFT <= 1 s"), ("nl<=0.025", "NL <= 0.025")):
                g = router_simulated.gain(rows, key, replicas, inner)
                if not math.isnan(g):
                    gains.append(f"{replicas} replicas, {inner}, {what}: {100 * (g - 1):+.1f}%")
    text = ("**Simulated figures are estimates** of the roofline cost model (A100-80GB, "
            "Llama-2-7B, a 1,536-block KV pool per replica, ShareGPT, Poisson arrivals, seed 0; "
            "the router's predictions carry log-normal error sigma 0.7, median relative error "
            "about 0.5, the embedded predictor's). `length-aware` over `least-loaded`, "
            "sustained rate: " + ("; ".join(gains) or "not bounded within the tested rates")
            + ".")
    if scale:
        text += (f" Cluster mode ran {scale['requests']:,} requests on {scale['replicas']} "
                 f"simulated replicas ({scale['virtual_s']:.0f} s of virtual time) in "
                 f"{scale['replay_wall_s']:.0f} s ({scale['replay_cpu_s']:.0f} s of CPU).")
    if real:
        hop = [h["added_p50_ms"] for h in real["hop"]]
        k = real["kill"]
        text += (f" Real, three opt-125m replicas on this machine (2 shared cores; timings "
                 f"move with other work): the router hop adds {min(hop):.2f}-{max(hop):.2f} ms "
                 f"at the median (min-max of {len(hop)} runs); killing a replica under load "
                 f"lost {k['lost_not_started']} requests that had not started, and "
                 f"{k['failed_started']} that had started there ended with an error.")
    return text


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = output.parser(__doc__, dataset="ShareGPT file (default: %(default)s)",
                       dataset_default=runs.SHAREGPT)
    ap.add_argument("--skip-real", action="store_true",
                    help="the simulated half only (no processes started on this machine)")
    ap.add_argument("--reuse-raw", action="store_true",
                    help="take the simulated results an earlier run of the same commands left "
                         "in --raw instead of running them again (virtual time: same figures)")
    args = ap.parse_args(argv)
    dataset = runs.dataset_file(args.dataset_path)
    out = output.outputs(args, NAME)
    start, t0 = stamp.take(), time.perf_counter()
    plan = router_simulated.QUICK if args.quick else router_simulated.FULL
    found, commands = router_simulated.run_sweeps(plan, dataset, out.raw, args.reuse_raw)
    scale = None
    if not args.quick:
        scale, command = router_simulated.run_scale(dataset, out.raw, args.reuse_raw)
        commands.append(command)
    real = None
    if not args.skip_real:
        p = REAL_QUICK if args.quick else REAL
        real = router_real.measure(dataset, out.raw / "real", p["num"], p["rate"], p["runs"])
    rows = router_simulated.sustained_rows(found)
    router_simulated.plot(out.file(NAME, "png"), found)
    tabs = [("Highest rate under each target, simulated (interpolated; `>=`: met at every "
             "tested rate, `<`: at none)", router_simulated.sustained_table(rows))]
    for replicas in sorted(plan):
        tabs.append((f"P99 TTFT (s), {replicas} simulated replicas",
                     router_simulated.ttft_table(found, replicas)))
    if real:
        tabs.append((f"Real: three opt-125m replicas, {real['loaded'][0]['rate']:g} req/s, "
                     "min-max over runs", tables.markdown(
                         ["router", "mean TTFT (ms)", "P99 TTFT (ms)", "NL (s/token)",
                          "failed"], real_rows(real))))
    section = output.Section(
        title="Replicas behind the router",
        text=summary_text(rows, scale, real), tables=tabs,
        figure_alt="P99 TTFT vs request rate per router policy, simulated replicas")
    output.publish(out, NAME, section, argv=argv, commands=commands,
                   stamp=stamp.finish(start, time.perf_counter() - t0),
                   data={"params": {"plan": {str(k): v for k, v in plan.items()},
                                    "predictor": router_simulated.PREDICTOR,
                                    "num_gpu_blocks": router_simulated.NUM_GPU_BLOCKS,
                                    "real": None if args.skip_real else
                                    (REAL_QUICK if args.quick else REAL),
                                    "dataset": output.rel(dataset)},
                         "sustained": rows, "runs": found, "scale": scale, "real": real})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
