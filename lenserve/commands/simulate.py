"""``lenserve simulate``: ``lenserve bench`` in virtual time. The real serving core and
policies run against a cost model instead of a model: fitted to a measured profile
(``--profile``, from ``lenserve profile``; the bundled opt-125m CPU profile by default) or the
analytical roofline for the papers' settings (``--hardware``/``--model-shape``, estimates).

Same workloads, arrivals, metrics, table, JSON and sweep figure as ``lenserve bench``;
backends are ``sim:<policy>``. ``--replicas N --router P[,P...]``: cluster mode, the real
router core over N simulated replicas of that policy (backends ``sim:<policy>/<router>``)."""
from __future__ import annotations

import argparse
import gc
import sys
import time
from importlib import resources

from lenserve.bench.backends import BackendOptions
from lenserve.bench.metrics import parse_goodput, parse_jct_slo
from lenserve.bench.report import format_report, summarize_runs
from lenserve.commands.bench import (
    add_workload_arguments,
    build_workloads,
    load_tokenizer,
    parse_rates,
    sample_config,
    write_outputs,
)
from lenserve.commands.engine_args import add_engine_arguments
from lenserve.workloads import load_samples
from services.hardware import DTYPE_AUTO_HELP
from services.predictor.local import reads_prompts
from services.router.policies import DEFAULT_POLICY as DEFAULT_ROUTER
from services.router.policies import POLICIES as ROUTER_POLICIES
from services.router.policies import parse_router_spec
from services.scheduler.policies import POLICIES
from services.simulator.roofline import HARDWARE
from services.simulator.shapes import MODEL_SHAPES

DEFAULT_PROFILE = "profile_opt-125m_cpu.json"


def register(subparsers) -> None:
    p = subparsers.add_parser("simulate", help="bench in virtual time with a cost model",
                              description=__doc__)
    p.add_argument("--backends", default="sim:vllm", help="comma-separated sim:<policy>")
    p.add_argument("--model", default=None,
                   help="tokenizer preset for the workload (default: the profile's model)")
    p.add_argument("--profile", help="profile JSON from `lenserve profile` (default: the "
                                     "bundled opt-125m CPU profile)")
    p.add_argument("--hardware", choices=sorted(HARDWARE), help="roofline mode: the device")
    p.add_argument("--model-shape", choices=sorted(MODEL_SHAPES), help="roofline mode: the model")
    p.add_argument("--block-size", type=int, default=None,
                   help="roofline mode: tokens per KV block (default 16; a profile fixes its own)")
    p.add_argument("--dtype", default="auto",
                   help="the dtype of the run modelled, as `bench --dtype` (a profile measured in "
                        f"another is noted on stderr). {DTYPE_AUTO_HELP}")
    p.add_argument("--device", default="cpu",
                   help="the device of the run modelled, as `bench --device` (a profile measured "
                        "on another is noted on stderr)")
    p.add_argument("--overheads", default=None,
                   help="the scheduler's CPU time per iteration and the predictor's latency to "
                        "charge, a JSON file as benchmarks/sim_overheads.py writes (default: "
                        "the measured services/simulator/data/overheads.json; none: charge "
                        "nothing)")
    p.add_argument("--replicas", type=int, default=1,
                   help="cluster mode: this many simulated replicas behind the router (1: one "
                        "engine, no router)")
    p.add_argument("--router", default=None,
                   help="cluster mode: comma-separated router policies to compare "
                        f"({', '.join(sorted(ROUTER_POLICIES))}; default {DEFAULT_ROUTER}); "
                        "NAME:no-prefix turns that policy's prefix affinity off")
    p.add_argument("--load-interval", type=float, default=0.1,
                   help="cluster mode: virtual seconds between a replica's load reports")
    add_workload_arguments(p)
    add_engine_arguments(p)
    p.set_defaults(func=run_simulate)


def parse_routers(args: argparse.Namespace) -> list[str | None]:
    """The router policies of a cluster run ([None]: one engine, no router)."""
    if args.replicas < 1:
        raise ValueError(f"--replicas must be >= 1, got {args.replicas}")
    if args.replicas == 1 and args.router is None:
        return [None]
    names = [n.strip() for n in (args.router or DEFAULT_ROUTER).split(",") if n.strip()]
    unknown = [n for n in names if parse_router_spec(n)[0] not in ROUTER_POLICIES]
    if unknown or not names or len(set(names)) != len(names):
        raise ValueError(f"--router must name each of {', '.join(sorted(ROUTER_POLICIES))} "
                         f"at most once, got {args.router!r}")
    return names


def parse_sim_backends(text: str) -> list[tuple[str, str]]:
    specs = []
    for item in (i.strip() for i in text.split(",") if i.strip()):
        kind, _, policy = item.partition(":")
        if kind != "sim" or policy not in POLICIES:
            raise ValueError(f"unknown backend {item!r}; use sim:<policy> with a policy of "
                             f"{', '.join(sorted(POLICIES))}")
        specs.append((item, policy))
    if not specs or len({s for s, _ in specs}) != len(specs):
        raise ValueError(f"--backends must name each sim:<policy> once, got {text!r}")
    return specs


def sim_target(args: argparse.Namespace):
    from services.simulator.target import from_profile, from_roofline, with_blocks, with_overheads
    if bool(args.hardware) != bool(args.model_shape):
        raise ValueError("--hardware and --model-shape go together (roofline mode)")
    if args.hardware and args.profile:
        raise ValueError("use either --profile or --hardware/--model-shape, not both")
    if args.block_size is not None and (args.block_size < 1 or not args.hardware):
        raise ValueError("--block-size must be >= 1 and goes with --hardware/--model-shape "
                         "(a profile was measured with its own block size)")
    if args.hardware:
        target = from_roofline(args.hardware, args.model_shape, args.block_size or 16)
    elif args.profile:
        target = from_profile(args.profile, args.model)
    else:
        with resources.as_file(resources.files("lenserve.data") / DEFAULT_PROFILE) as path:
            target = from_profile(str(path), args.model)
    return with_overheads(with_blocks(target, args.num_gpu_blocks), args.overheads)


def run_simulate(args: argparse.Namespace) -> int:
    from lenserve.bench.simulation import SimSpec
    from services.simulator.target import precision_mismatch

    specs = parse_sim_backends(args.backends)
    routers = parse_routers(args)
    slos, rates = parse_goodput(args.goodput), parse_rates(args)
    jct_slo = parse_jct_slo(args.jct_slo)
    target = sim_target(args)
    mismatch = precision_mismatch(target, args.dtype, args.device)
    if mismatch:
        print(mismatch, file=sys.stderr)
    if args.model is None:   # the workload is counted in the simulated model's tokenizer
        args.model = target.shape.name if target.shape.name in _presets() else "opt-125m"
    tokenizer = load_tokenizer(args)
    options = BackendOptions(model=args.model, predictor=args.predictor,
                             predictor_seed=args.predictor_seed,
                             policy_config=tuple(args.policy_config or ()),
                             max_num_seqs=args.max_num_seqs, max_model_len=args.max_model_len,
                             swap_space_gib=args.swap_space, kv_int8=args.kv_int8,
                             enable_prefix_caching=args.enable_prefix_caching,
                             prefix_cache_host_blocks=args.prefix_cache_host_blocks)
    workloads = build_workloads(args, load_samples(args.dataset_name, args.dataset_path),
                                sample_config(args), rates, tokenizer)
    # What is loaded so far lives for the whole command: keep the cycle collector off it
    # (given back at the end, so that a caller's process collects it as before).
    gc.freeze()
    try:
        text = _prompt_text(tokenizer) if reads_prompts(args.predictor) else None
        print("\n".join(target.notes), file=sys.stderr)
        runs = []
        for (name, policy), router in ((s, r) for s in specs for r in routers):
            label = name if router is None else f"{name}/{router}"
            spec = SimSpec(label, policy, target, options, text)
            for workload, rate in zip(workloads, rates):
                began, cpu = time.perf_counter(), time.process_time()
                runs.append(_run_one(spec, router, args, workload, rate))
                wall, cpu = time.perf_counter() - began, time.process_time() - cpu
                print(f"{label} @ {rate:g} req/s: simulated {runs[-1].duration_s:.1f}s in "
                      f"{wall:.1f}s ({cpu:.1f}s of CPU)", file=sys.stderr)
        results = summarize_runs(runs, slos, jct_slo)
        print(format_report(results))
        write_outputs(args, results, runs)
    finally:
        gc.unfreeze()
    return 0


def _run_one(spec, router: str | None, args: argparse.Namespace, workload, rate: float):
    from lenserve.bench.simulation import simulate
    if router is None:
        return simulate(spec, workload, rate, not args.disable_tqdm)
    from lenserve.bench.cluster import ClusterSpec, simulate_cluster
    cluster = ClusterSpec(args.replicas, router, args.load_interval)
    return simulate_cluster(spec, cluster, workload, rate, not args.disable_tqdm)


def _presets() -> set[str]:
    from services.executor.models.presets import PRESETS
    return set(PRESETS)


def _prompt_text(tokenizer):
    """What the real engine hands its predictor for a token-ids request: the decoded prompt."""
    return lambda ids: tokenizer.decode(list(ids), skip_special_tokens=True)
