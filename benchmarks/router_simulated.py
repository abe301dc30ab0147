"""The simulated half of ``benchmarks/router.py``: ``lenserve simulate --replicas N --router
...`` on the roofline cost model of A100-80GB replicas serving Llama-2-7B, ShareGPT, Poisson
arrivals, each replica a KV pool of 1,536 blocks of 16 tokens (as ``policies_simulated``),
predictions with log-normal error sigma 0.7 (median relative error about 0.5, the embedded
predictor's on ShareGPT). Two seeds (each its own sample of ShareGPT, arrivals and prediction
errors); round-robin, far behind, on the first only. Virtual time: the figures do not depend
on the machine's load."""
from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from benchmarks import figures, runs, tables

ROUTERS = ("round-robin", "least-loaded", "length-aware")
INNER = ("vllm", "alise")
COMPARED = ("least-loaded", "length-aware")     # the routers run on every seed
SEEDS = (0, 1)
QUICK_SEEDS = (0,)
PREDICTOR = "oracle:0.7"           # :SEED follows
NUM_GPU_BLOCKS = 1536
TTFT_TARGETS_S = (1.0,)             # P99 TTFT
NL_TARGETS = (0.025,)               # normalized latency, s/token: 1.6x the unloaded value
# Per replica count: requests per rate and the rates (req/s), light load to overload, finer
# near the knees of both targets (P99 TTFT first, NL later; with ``alise`` inside the NL knee
# lies past 100 req/s at 8 replicas on some seeds and past 200 at 16).
FULL = {8: (3000, [72, 75, 78, 81, 88, 94, 100, 106]),
        16: (5000, [144, 150, 156, 162, 176, 200, 220, 240])}
QUICK = {8: (16, [40, 80])}
SCALE = (16, 100_000, 140)          # replicas, requests, req/s: the size the mode is for
# Prefix affinity: ShareGPT conversations, every human turn a request carrying the conversation
# so far (``sharegpt-multiturn``), 8 replicas, ``vllm`` inside, prefix caching on (the
# default); each router with and without affinity where it has it.
CONVERSATIONS = runs.SHAREGPT.parent / "sharegpt_v3_conversations_first17671.jsonl.gz"
AFFINITY_ROUTERS = ("round-robin", "least-loaded", "prefix-affinity", "length-aware:no-prefix",
                    "length-aware")
AFFINITY = (8, 2000, [30, 45, 60, 75])
AFFINITY_QUICK = (8, 40, [40])


def simulate_args(replicas: int, num_prompts: int, rates: list[float], dataset: Path,
                  result: Path, routers=ROUTERS, inner=INNER, repeat: bool = False,
                  dataset_name: str = "sharegpt", seed: int = 0) -> list[str]:
    return ["simulate", "--hardware", "a100-80g", "--model-shape", "llama-2-7b",
            "--backends", ",".join(f"sim:{p}" for p in inner), "--predictor", f"{PREDICTOR}:{seed}",
            "--replicas", str(replicas), "--router", ",".join(routers),
            "--dataset-name", dataset_name, "--dataset-path", str(dataset),
            "--num-prompts", str(num_prompts), *(["--repeat-dataset"] if repeat else []),
            "--num-gpu-blocks", str(NUM_GPU_BLOCKS),
            "--sweep-rates", ",".join(f"{r:g}" for r in rates), "--seed", str(seed),
            "--disable-tqdm", "--no-records", "--result-json", str(result)]


def _run(args: list[str], result: Path, log: Path, reuse: bool) -> float:
    """``lenserve ARGS``, or nothing when ``reuse`` and an earlier run of the same command
    left its result (virtual time: the same command gives the same figures)."""
    if reuse and result.exists() and log.exists() and \
            json.loads(result.read_text())["config"]["sweep_rates"] == args[args.index(
                "--sweep-rates") + 1]:
        return 0.0
    return runs.lenserve(args, log)


def in_parallel(jobs: int, calls: list) -> list:
    """Each of ``calls`` (no-argument functions), ``jobs`` at a time (each starts its own
    ``lenserve`` process); their results in order."""
    with ThreadPoolExecutor(max(1, jobs)) as pool:
        return [f.result() for f in [pool.submit(c) for c in calls]]


def sweep_jobs(plan: dict, dataset: Path, raw: Path, seeds=SEEDS, reuse: bool = False,
               first_routers=ROUTERS, inner_policies=INNER, reuse_only: bool = False) -> list:
    """One call per replica count, seed and inner policy, the larger clusters first: it runs
    (or reuses) the sweep and returns its runs and its command line. ``reuse_only``: a sweep
    with no earlier result is left out (no runs, no command line)."""
    def job(replicas, num_prompts, rates, seed, inner):
        stem = f"sim_{replicas}_s{seed}_{inner}"
        result = raw / f"{stem}.json"
        routers = first_routers if seed == seeds[0] else COMPARED
        args = simulate_args(replicas, num_prompts, rates, dataset, result, routers=routers,
                             inner=(inner,), seed=seed)

        def call():
            if reuse_only and not result.exists():
                return [], None
            _run(args, result, raw / f"{stem}.log", reuse or reuse_only)
            found = []
            for run in runs.load_runs(result):
                inner, router = run["policy"].split("/")
                found.append({**run, "replicas": replicas, "seed": seed, "inner": inner,
                              "router": router})
            return found, runs.shown(args)
        return call
    return [job(replicas, n, rates, seed, inner)
            for replicas, (n, rates) in sorted(plan.items(), reverse=True)
            for seed in seeds for inner in inner_policies]


def run_scale(dataset: Path, raw: Path, reuse: bool = False) -> tuple[dict, str]:
    """One run of the size cluster mode is for; its wall and CPU time from the command's log."""
    replicas, num_prompts, rate = SCALE
    result = raw / "scale.json"
    args = simulate_args(replicas, num_prompts, [rate], dataset, result,
                         routers=("length-aware",), inner=("vllm",), repeat=True)
    wall = _run(args, result, raw / "scale.log", reuse)
    m = re.search(r"simulated ([\d.]+)s in ([\d.]+)s \(([\d.]+)s of CPU\)",
                  (raw / "scale.log").read_text())   # not the overheads line's "simulated"
    summary = json.loads(result.read_text())["runs"][0]["summary"]
    return ({"replicas": replicas, "requests": num_prompts, "rate": rate,
             "virtual_s": float(m[1]), "replay_wall_s": float(m[2]), "replay_cpu_s": float(m[3]),
             "command_wall_s": wall, "completed": summary["completed"],
             "failed": summary["failed"]}, runs.shown(args))


def run_affinity(plan: tuple, raw: Path, reuse: bool = False) -> tuple[list[dict], str]:
    """The multi-turn sweep: per router and rate, the prefix cache's hit rate (prompt tokens
    served from cache over those looked up), P99 TTFT and normalized latency."""
    replicas, num_prompts, rates = plan
    result = raw / "affinity.json"
    args = simulate_args(replicas, num_prompts, rates, CONVERSATIONS, result,
                         routers=AFFINITY_ROUTERS, inner=("vllm",),
                         dataset_name="sharegpt-multiturn")
    _run(args, result, raw / "affinity.log", reuse)
    found = []
    for run in runs.load_runs(result):
        s = run["summary"]
        found.append({"router": run["policy"].split("/")[1], "rate": run["request_rate"],
                      "hit_rate": s["prefix_cache_hits"] / max(s["prefix_cache_queries"], 1),
                      "p99_ttft_s": s["ttft_ms"]["p99"] / 1000.0, "nl": s[tables.NL],
                      "failed": s["failed"]})
    return found, runs.shown(args)


def affinity_table(found: list[dict]) -> list[str]:
    rates = sorted({r["rate"] for r in found})
    body = [[router] + [next(f"{r['hit_rate']:.0%} / {r['p99_ttft_s']:.2f} / {r['nl']:.4f}"
                             for r in found if r["router"] == router and r["rate"] == rate)
                        for rate in rates] for router in AFFINITY_ROUTERS]
    for row, router in zip(body, AFFINITY_ROUTERS):
        rate, note = tables.sustained_rate([(r["rate"], r["p99_ttft_s"]) for r in found
                                            if r["router"] == router], TTFT_TARGETS_S[0])
        row.append(f"{note}{rate:.1f}")
    return tables.markdown(["router", *(f"{rate:g} req/s" for rate in rates),
                            f"P99 TTFT <= {TTFT_TARGETS_S[0]:g} s (req/s)"], body)


def p99_ttft_s(run: dict) -> float:
    return run["summary"]["ttft_ms"]["p99"] / 1000.0


def sustained(found: list[dict], replicas: int, inner: str, router: str, seed: int, key,
              limit: float):
    points = [(r["request_rate"], key(r)) for r in found
              if (r["replicas"], r["inner"], r["router"], r.get("seed", 0)) ==
              (replicas, inner, router, seed)]
    return tables.sustained_rate(points, limit)


def target_keys() -> list[str]:
    return [f"p99_ttft<={t:g}s" for t in TTFT_TARGETS_S] + [f"nl<={t:g}" for t in NL_TARGETS]


def sustained_rows(found: list[dict]) -> list[dict]:
    """Per replica count, inner policy, router and seed: the highest rate under each target."""
    rows = []
    for replicas in sorted({r["replicas"] for r in found}):
        for inner in INNER:
            for router in ROUTERS:
                for seed in sorted({r.get("seed", 0) for r in found}):
                    row = {"replicas": replicas, "inner": inner, "router": router, "seed": seed}
                    for t in TTFT_TARGETS_S:
                        row[f"p99_ttft<={t:g}s"] = sustained(found, replicas, inner, router,
                                                             seed, p99_ttft_s, t)
                    for t in NL_TARGETS:
                        row[f"nl<={t:g}"] = sustained(found, replicas, inner, router, seed,
                                                      lambda r: r["summary"][tables.NL], t)
                    if any(v[0] == v[0] for k, v in row.items() if "<=" in k):
                        rows.append(row)
    return rows


def gain(rows: list[dict], key: str, replicas: int, inner: str, seed: int | None = None
         ) -> float:
    """length-aware's sustained rate over least-loaded's (NaN if either is unbounded)."""
    by = {r["router"]: r[key] for r in rows if (r["replicas"], r["inner"]) == (replicas, inner)
          and (seed is None or r.get("seed", 0) == seed)}
    if "length-aware" not in by or "least-loaded" not in by:
        return float("nan")
    (la, la_note), (ll, ll_note) = by["length-aware"], by["least-loaded"]
    return la / ll if ll > 0 and not la_note and not ll_note else float("nan")


def sustained_table(rows: list[dict]) -> list[str]:
    """One line per replica count, inner policy and router; a column per target and seed."""
    keys, seeds = target_keys(), sorted({r.get("seed", 0) for r in rows})
    body = []
    for replicas, inner, router in dict.fromkeys((r["replicas"], r["inner"], r["router"])
                                                 for r in rows):
        by = {r.get("seed", 0): r for r in rows
              if (r["replicas"], r["inner"], r["router"]) == (replicas, inner, router)}
        body.append([str(replicas), inner, router,
                     *(f"{by[s][k][1]}{by[s][k][0]:.1f}" if s in by else "-"
                       for k in keys for s in seeds)])
    heads = [k.replace("p99_ttft", "P99 TTFT ").replace("nl", "NL ") + f", seed {s} (req/s)"
             for k in keys for s in seeds]
    return tables.markdown(["replicas", "in the replicas", "router", *heads], body)


def ttft_table(found: list[dict], replicas: int, seed: int = 0) -> list[str]:
    sub = [{**r, "policy": f"{r['inner']}/{r['router']}"} for r in found
           if r["replicas"] == replicas and r.get("seed", 0) == seed]
    return tables.rate_table(sub, lambda s: s["ttft_ms"]["p99"] / 1000.0, "{:.2f}")


def plot(path: Path, found: list[dict]) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    counts = sorted({r["replicas"] for r in found})
    fig, axes = plt.subplots(1, len(counts), figsize=(5 * len(counts), 3.8), squeeze=False)
    for ax, replicas in zip(axes[0], counts):
        for i, (inner, router) in enumerate((i, r) for i in INNER for r in ROUTERS):
            pts = sorted((r["request_rate"], p99_ttft_s(r)) for r in found
                         if (r["replicas"], r["inner"], r["router"]) == (replicas, inner, router)
                         and r.get("seed", 0) == 0)
            if pts:
                ax.plot(*zip(*pts), marker="osD"[i % 3], linestyle="-" if inner == "vllm"
                        else "--", color=plt.get_cmap("tab10").colors[i % 3],
                        label=f"{inner} / {router}", markersize=4)
        ax.set_yscale("log")
        ax.set_title(f"{replicas} simulated A100s, Llama-2-7B, ShareGPT (seed 0)", fontsize=9)
        ax.set_xlabel("request rate (req/s)")
        ax.set_ylabel("P99 TTFT (s)")
        ax.grid(True, alpha=0.3)
    axes[0][-1].legend(fontsize=7, loc="upper left")
    figures.save(fig, path)
