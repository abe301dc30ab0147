"""``lenserve profile``: time the real executor over a grid of batches (prefill chunks, decode
sequences, attended context) and write the JSON profile that ``lenserve simulate --profile``
fits its cost model to. On a CPU the grid stays small: a few minutes for opt-125m."""
from __future__ import annotations

import argparse
import sys

import torch
from tqdm import tqdm

from services.executor.attention.registry import BACKEND_CHOICES


def register(subparsers) -> None:
    p = subparsers.add_parser("profile", help="measure iteration times for the simulator",
                              description=__doc__)
    p.add_argument("--model", required=True, help="preset name or local checkpoint directory")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--attention-backend", default="auto", choices=BACKEND_CHOICES)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--max-num-batched-tokens", type=int, default=2048,
                   help="largest batch measured (the engine's token budget)")
    p.add_argument("--repeats", type=int, default=3, help="timed calls per point, after a warm-up")
    p.add_argument("--threads", type=int, default=None, help="CPU intra-op threads")
    p.add_argument("--out", required=True, help="profile JSON to write")
    p.add_argument("--disable-tqdm", action="store_true")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from services.executor.runner import InProcessExecutor
    from services.simulator.profiler import run_profile

    if args.threads:
        torch.set_num_threads(args.threads)
    executor = InProcessExecutor(args.model, block_size=args.block_size, dtype=args.dtype,
                                 device=args.device, attention_backend=args.attention_backend)
    bar = (lambda items: tqdm(items, desc=f"profile {args.model}", unit="point",
                              disable=args.disable_tqdm, file=sys.stderr))
    profile = run_profile(executor, max_tokens=args.max_num_batched_tokens,
                          repeats=args.repeats, progress=bar)
    profile.save(args.out)
    model, report = profile.fit()
    print(f"{len(profile.points)} points written to {args.out}")
    print(model.describe())
    print(report)
    return 0
