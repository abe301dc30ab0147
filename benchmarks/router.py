"""Replicas behind the router: the three placement policies against each other.

    python3 benchmarks/router.py [--quick] [--dataset-path FILE] [--skip-real] [--jobs N]
                                 [--compared-only] [--hop-only]

Simulated (``benchmarks/router_simulated.py``): 8 and 16 A100-80GB replicas serving
Llama-2-7B, ShareGPT, ``vllm`` and ``alise`` inside the replicas, each router policy over a
rate sweep, two seeds; the highest rate each sustains under a P99 TTFT target and a
normalized-latency target; prefix affinity on multi-turn ShareGPT conversations (8 replicas, each router with
and without it: the prefix cache's hit rate, P99 TTFT, NL); and one run of 100,000 requests on
16 replicas, with its wall time. Real (``benchmarks/router_real.py``): three opt-125m replicas
on this machine, each router at a loaded rate (failures by cause) and the replica-kill drill;
the router hop's added latency on a stub replica (``benchmarks/router_hop.py``, 500
interleaved pairs); two runs each.
"""
from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

if __package__ in (None, ""):       # run as a script: the repository root holds benchmarks/
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import (output, router_hop, router_real, router_simulated,  # noqa: E402
                        runs, stamp, tables)

NAME = "router"
# The loaded comparison: two rounds, each router once a round (min-max on the page; the
# replicas decode on the CPU: run it on an idle machine), then the kill drill. The hop: two
# runs.
REAL = {"num": 18, "rate": 2.0, "runs": 2, "hop_runs": 2, "hop_pairs": 500}
REAL_QUICK = {"num": 6, "rate": 4.0, "runs": 1, "hop_runs": 1, "hop_pairs": 50}


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
                     str(sum(s["failed"] for s in got)), causes(real, router)])
    return rows


def causes(real: dict, router: str) -> str:
    total: dict[str, int] = {}
    for r in real["loaded"]:
        if r["router"] == router:
            for cause, n in r["failures"].items():
                total[cause] = total.get(cause, 0) + n
    return "; ".join(f"{n} {cause}" for cause, n in sorted(total.items())) or "-"


def hop_rows(hops: list[dict]) -> list[list[str]]:
    """Per run: the routed-minus-direct percentiles, the placement time, the load."""
    return [[str(i + 1), str(h["num"]), f"{h['load_avg']:.1f}",
             *(f"{h[k]['p50']:.2f} / {h[k]['p90']:.2f} / {h[k]['p99']:.2f}"
               for k in ("direct_ttft_ms", "added_ttft_ms", "added_e2e_ms")),
             f"{h['place_us_mean']:.0f}" if h["place_us_mean"] is not None else "?"]
            for i, h in enumerate(hops)]


def affinity_text(affinity: list[dict]) -> str:
    """Hit rate and P99 TTFT with and without affinity, at the highest rate tested."""
    if not affinity:
        return (" Round-robin, prefix affinity and the 100,000-request run were not run this "
                "time (`--compared-only`).")
    top = max(r["rate"] for r in affinity)
    at = {r["router"]: r for r in affinity if r["rate"] == top}
    parts = [f"`{name}` {at[name]['hit_rate']:.0%} hits, P99 TTFT {at[name]['p99_ttft_s']:.2f} s"
             for name in router_simulated.AFFINITY_ROUTERS if name in at]
    return (f" Prefix affinity on multi-turn conversations (8 replicas, {top:g} turns/s): "
            + "; ".join(parts) + ".")


def summary_text(rows: list[dict], scale: dict | None, real: dict | None,
                 affinity: list[dict]) -> str:
    gains = []
    seeds = sorted({r.get("seed", 0) for r in rows})
    for replicas in sorted({r["replicas"] for r in rows}):
        for inner in router_simulated.INNER:
            for key, what in (("p99_ttft<=1s", "P99 TTFT <= 1 s"), ("nl<=0.025", "NL <= 0.025")):
                g = [router_simulated.gain(rows, key, replicas, inner, s) for s in seeds]
                bounded = [x for x in g if not math.isnan(x)]
                if bounded:
                    span = f"{min(bounded):.3f}" + (f"-{max(bounded):.3f}" if len(bounded) > 1
                                                    else "")
                    gains.append(f"{replicas} replicas, {inner}, {what}: {span}x" + (
                        f" ({len(g) - len(bounded)} seed(s) not bounded)"
                        if len(bounded) < len(g) else ""))
    text = ("**Simulated figures are estimates** of the roofline cost model (A100-80GB, "
            "Llama-2-7B, a 1,536-block KV pool per replica, ShareGPT, Poisson arrivals; the "
            "router's predictions carry log-normal error sigma 0.7, median relative error "
            "about 0.5, the embedded predictor's). `length-aware` over `least-loaded`, "
            f"sustained rate, min-max over {len(seeds)} seed(s) (each its own ShareGPT sample, "
            "arrivals and prediction errors): "
            + ("; ".join(gains) or "not bounded within the tested rates")
            + ".") + affinity_text(affinity)
    if scale:
        text += (f" Cluster mode ran {scale['requests']:,} requests on {scale['replicas']} "
                 f"simulated replicas ({scale['virtual_s']:.0f} s of virtual time) in "
                 f"{scale['replay_wall_s']:.0f} s ({scale['replay_cpu_s']:.0f} s of CPU).")
    if real:
        hop = [h["added_ttft_ms"]["p50"] for h in real["hop"]]
        k = real["kill"]
        text += (f" Real, on this machine (2 shared cores; timings move with other work): the "
                 f"router hop adds {min(hop):.2f}-{max(hop):.2f} ms to the median time to first "
                 f"token (min-max of {len(hop)} runs of {real['hop'][0]['num']} interleaved "
                 "pairs on a stub replica); killing one of three opt-125m replicas under load "
                 f"lost {k['lost_not_started']} requests that had not started, and "
                 f"{k['failed_started']} that had started there ended with an error. The "
                 f"loaded comparison: {1 + max(r['run'] for r in real['loaded'])} rounds, each "
                 "router once a round (every other round in reverse order), replicas without "
                 "prefix caching (every router sends the same prompts).")
        if real.get("carried_from"):
            c = real["carried_from"]
            text += (f" Only the hop was measured this time (`--hop-only`); every other figure "
                     f"is the one the page of {c['date']} (commit {c['commit']}) published.")
    return text


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = output.parser(__doc__, dataset="ShareGPT file (default: %(default)s)",
                       dataset_default=runs.SHAREGPT)
    ap.add_argument("--skip-real", action="store_true",
                    help="the simulated half only (no processes started on this machine)")
    ap.add_argument("--reuse-raw", action="store_true",
                    help="take the simulated results an earlier run of the same commands left "
                         "in --raw instead of running them again (virtual time: same figures), "
                         "and the real loaded comparison and kill drill an earlier run with the "
                         "same parameters left there (the hop is measured again)")
    ap.add_argument("--compared-only", action="store_true",
                    help="the simulated sweeps of least-loaded and length-aware only: no "
                         "round-robin, prefix-affinity sweep or 100,000-request run (for a "
                         "machine too busy to run them)")
    ap.add_argument("--reuse-only", action="store_true",
                    help="publish the simulated sweeps an earlier run left in --raw and leave "
                         "out those it did not finish (the page lists them)")
    ap.add_argument("--inner", default=",".join(router_simulated.INNER),
                    help="the policies inside the replicas (default %(default)s)")
    ap.add_argument("--jobs", type=int, default=4,
                    help="simulations run at once, each its own process (default %(default)s)")
    ap.add_argument("--hop-only", action="store_true",
                    help="measure the hop again and publish it with every other figure taken "
                         "from the published page (its JSON), which the page then names")
    args = ap.parse_args(argv)
    dataset = runs.dataset_file(args.dataset_path)
    out = output.outputs(args, NAME)
    start, t0 = stamp.take(), time.perf_counter()
    plan = router_simulated.QUICK if args.quick else router_simulated.FULL
    seeds = router_simulated.QUICK_SEEDS if args.quick else router_simulated.SEEDS
    if args.hop_only:
        return _hop_only(args, argv, out, start, t0)
    sweeps = router_simulated.sweep_jobs(
        plan, dataset, out.raw, seeds, args.reuse_raw,
        router_simulated.COMPARED if args.compared_only else router_simulated.ROUTERS,
        tuple(args.inner.split(",")), args.reuse_only)
    extra = [lambda: router_simulated.run_affinity(
        router_simulated.AFFINITY_QUICK if args.quick else router_simulated.AFFINITY,
        out.raw, args.reuse_raw) if not args.compared_only else ([], None)]
    if not args.quick and not args.compared_only:      # the longest run first
        extra.insert(0, lambda: router_simulated.run_scale(dataset, out.raw, args.reuse_raw))
    done = router_simulated.in_parallel(args.jobs, extra[:-1] + sweeps + extra[-1:])
    scale, swept, (affinity, affinity_command) = \
        (done[0] if len(extra) > 1 else None), done[len(extra) - 1:-1], done[-1]
    found = [run for runs_, _ in swept for run in runs_]
    commands = [command for _, command in swept if command]
    missing = sorted({(r, i) for r in plan for i in args.inner.split(",")} -
                     {(run["replicas"], run["inner"]) for run in found})
    if scale is not None:
        scale, scale_command = scale
        commands.append(scale_command)
    if affinity_command:
        commands.append(affinity_command)
    real = None
    if not args.skip_real:
        p = REAL_QUICK if args.quick else REAL
        real = router_real.measure_or_reuse(dataset, out.raw / "real", p, args.reuse_raw)
        real["hop"] = [router_hop.measure(out.raw / "hop", p["hop_pairs"])
                       for _ in range(p["hop_runs"])]
    _publish(args, argv, out, start, t0, dataset, plan, seeds, found, commands, scale, real,
             affinity, missing)
    return 0


def _hop_only(args, argv, out, start, t0) -> int:
    """The hop measured again; the rest as the published page has it."""
    page = json.loads(out.file(NAME, "json").read_text())
    real = page["real"]
    if real is None:
        raise SystemExit("the published page has no real section to add the hop to")
    real["hop"] = [router_hop.measure(out.raw / "hop", real["params"]["hop_pairs"])
                   for _ in range(real["params"]["hop_runs"])]
    # The page that measured the rest (an earlier --hop-only passes on where it had them).
    real["carried_from"] = real.get("carried_from") or {k: page["stamp"][k]
                                                        for k in ("date", "commit")}
    plan = {int(k): tuple(v) for k, v in page["params"]["plan"].items()}
    _publish(args, argv, out, start, t0, stamp.REPO / page["params"]["dataset"], plan,
             tuple(page["params"]["seeds"]), page["runs"], page["lenserve_commands"],
             page["scale"], real, page["affinity"], [])
    return 0


def _publish(args, argv, out, start, t0, dataset, plan, seeds, found, commands, scale, real,
             affinity, missing) -> None:
    rows = router_simulated.sustained_rows(found)
    router_simulated.plot(out.file(NAME, "png"), found)
    tabs = [("Highest rate under each target, simulated, per seed (interpolated between the "
             "tested rates; `>=`: met at every tested rate, `<`: at none)",
             router_simulated.sustained_table(rows))]
    for replicas in sorted(plan):
        tabs.append((f"P99 TTFT (s), {replicas} simulated replicas, seed 0",
                     router_simulated.ttft_table(found, replicas)))
    if affinity:
        tabs.append(("Prefix affinity, 8 simulated replicas (`vllm` inside), multi-turn "
                     "ShareGPT: prefix-cache hit rate / P99 TTFT (s) / NL (s/token) per "
                     "conversation-turn rate, and the highest rate under the P99 TTFT target",
                     router_simulated.affinity_table(affinity)))
    if real:
        tabs.append((f"Real: three opt-125m replicas, {real['loaded'][0]['rate']:g} req/s, "
                     "min-max over runs", tables.markdown(
                         ["router", "mean TTFT (ms)", "P99 TTFT (ms)", "NL (s/token)",
                          "failed", "failures by cause"], real_rows(real))))
        tabs.append(("Real: the router hop on a stub replica, routed minus direct, p50 / p90 / "
                     "p99 (ms), sequential interleaved pairs", tables.markdown(
                         ["run", "pairs", "load avg", "direct TTFT", "added TTFT",
                          "added to the last token", "placement (us, mean)"],
                         hop_rows(real["hop"]))))
    section = output.Section(
        title="Replicas behind the router",
        text=summary_text(rows, scale, real, affinity) + ("" if not missing else (
            " Not run this time (the machine was too busy to finish them): " + "; ".join(
                f"{r} replicas with `{i}` inside" for r, i in missing) + ".")), tables=tabs,
        figure_alt="P99 TTFT vs request rate per router policy, simulated replicas")
    output.publish(out, NAME, section, argv=argv, commands=commands,
                   stamp=stamp.finish(start, time.perf_counter() - t0),
                   data={"params": {"plan": {str(k): v for k, v in plan.items()},
                                    "predictor": router_simulated.PREDICTOR,
                                    "seeds": list(seeds),
                                    "num_gpu_blocks": router_simulated.NUM_GPU_BLOCKS,
                                    "real": None if args.skip_real else
                                    (REAL_QUICK if args.quick else REAL),
                                    "dataset": output.rel(dataset)},
                         "sustained": rows, "runs": found, "scale": scale, "real": real,
                         "affinity": affinity})


if __name__ == "__main__":
    raise SystemExit(main())
