"""Engine flags shared by ``generate``, ``bench`` and ``serve``: the policy's options, the
length predictor, the KV pool and the host tier. Parsed here once (the scheduler service and
the `lenserve` commands)."""
from __future__ import annotations

import argparse

from services.scheduler.policies import POLICIES


def add_engine_arguments(p: argparse.ArgumentParser, *, policy: bool = False) -> None:
    if policy:
        p.add_argument("--policy", default="vllm",
                       help=f"scheduling policy: {', '.join(sorted(POLICIES))}")
    p.add_argument("--policy-config", nargs="+", metavar="KEY=VALUE",
                   help="options of the policy, e.g. aging_rate=0.5 (unknown keys are refused)")
    p.add_argument("--predictor", default="none",
                   help="output-length predictor: none, embedded (in-process, seeded from a "
                        "bundled ShareGPT sample), embedded:DIR (in-process, from a copy of the "
                        "DB `lenserve predictor build --qdrant-path DIR` wrote), oracle (the "
                        "true length), oracle:SIGMA[:SEED] (the true length times "
                        "exp(N(0, SIGMA)), seeded), grpc://HOST:PORT")
    p.add_argument("--predictor-seed", metavar="FILE",
                   help="JSON lines of {\"prompt\", \"output_len\"} to seed the embedded predictor")
    if not any(a.dest == "num_gpu_blocks" for a in p._actions):
        p.add_argument("--num-gpu-blocks", type=int, default=None,
                       help="device KV blocks (default: from memory); size it against the "
                            "workload to make requests queue")
    p.add_argument("--max-num-seqs", type=int, default=256, help="requests resident at once")
    p.add_argument("--swap-space", type=float, default=0.0, metavar="GIB",
                   help="host KV tier for swapped requests (0: none; policies recompute)")
    p.add_argument("--kv-int8", action="store_true", help="store swapped KV in channel-wise INT8")
    p.add_argument("--no-prefix-caching", dest="enable_prefix_caching", action="store_false",
                   help="recompute every prompt in full instead of sharing the KV of prefixes "
                        "already computed (automatic prefix caching is on by default)")
    p.add_argument("--prefix-cache-host-blocks", type=int, default=0, metavar="N",
                   help="keep up to N cached prefix blocks the device evicts in the host KV "
                        "tier (--swap-space) and upload them on a later hit; swapped requests "
                        "take precedence over them (0: cached blocks are dropped on eviction)")
    p.add_argument("--enforce-eager", action="store_true",
                   help="run decode iterations eagerly instead of replaying CUDA graphs")


def engine_options(args: argparse.Namespace) -> dict:
    """EngineConfig fields from the flags above."""
    return {"policy_config": tuple(args.policy_config or ()), "predictor": args.predictor,
            "predictor_seed": args.predictor_seed, "num_gpu_blocks": args.num_gpu_blocks,
            "max_num_seqs": args.max_num_seqs, "swap_space_gib": args.swap_space,
            "kv_int8": args.kv_int8, "enforce_eager": args.enforce_eager,
            "enable_prefix_caching": args.enable_prefix_caching,
            "prefix_cache_host_blocks": args.prefix_cache_host_blocks}
