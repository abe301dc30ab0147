"""``lenserve profile``: time the real executor over a grid of batches (prefill chunks, decode
sequences, attended context) and write the JSON profile that ``lenserve simulate --profile``
fits its cost model to, with the time of swaps to and from the host KV tier. On a CPU the grid
stays small: a few minutes for opt-125m. ``--swaps-only`` adds the swap measurements to an
existing profile of the same model (``--out``), keeping its iteration points.

The dtype defaults to ``auto``, as for ``serve`` and ``bench``: a profile is of the run it
times, so one taken in another dtype than the runs it stands for models them wrongly. The
profile records the dtype and device it was measured with."""
from __future__ import annotations

import argparse
import sys

import torch
from tqdm import tqdm

from services.executor.attention.registry import BACKEND_CHOICES
from services.hardware import DTYPE_AUTO_HELP


def register(subparsers) -> None:
    p = subparsers.add_parser("profile", help="measure iteration times for the simulator",
                              description=__doc__)
    p.add_argument("--model", required=True, help="preset name or local checkpoint directory")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default="auto", help=DTYPE_AUTO_HELP)
    p.add_argument("--attention-backend", default="auto", choices=BACKEND_CHOICES)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--max-num-batched-tokens", type=int, default=2048,
                   help="largest batch measured (the engine's token budget)")
    p.add_argument("--repeats", type=int, default=3, help="timed calls per point, after a warm-up")
    p.add_argument("--serving-iterations", type=int, default=300,
                   help="iterations of the real serving core timed after the grid (0: none); "
                        "they show the fit what consecutive, differing batches cost")
    p.add_argument("--threads", type=int, default=None, help="CPU intra-op threads")
    p.add_argument("--out", required=True, help="profile JSON to write")
    p.add_argument("--swaps-only", action="store_true",
                   help="measure only the swaps and add them to the profile at --out")
    p.add_argument("--disable-tqdm", action="store_true")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from services.executor.runner import InProcessExecutor
    from services.simulator.profiler import measure_swaps, run_profile

    if args.threads:
        torch.set_num_threads(args.threads)
    executor = InProcessExecutor(args.model, block_size=args.block_size, dtype=args.dtype,
                                 device=args.device, attention_backend=args.attention_backend)
    if args.swaps_only:
        return _add_swaps(args, executor, measure_swaps(executor, args.repeats))
    bar = (lambda items: tqdm(items, desc=f"profile {args.model}", unit="point",
                              disable=args.disable_tqdm, file=sys.stderr))
    profile = run_profile(executor, max_tokens=args.max_num_batched_tokens,
                          repeats=args.repeats, serving_iterations=args.serving_iterations,
                          progress=bar)
    profile.save(args.out)
    model, report = profile.fit()
    print(f"{len(profile.points)} points written to {args.out} ({profile.shape.name} in "
          f"{profile.shape.dtype} on {profile.device})")
    print(model.describe())
    print(report)
    return 0


def _add_swaps(args: argparse.Namespace, executor, swap) -> int:
    import dataclasses
    from datetime import datetime, timezone

    from services.simulator.profile_file import load_profile

    profile = load_profile(args.out)
    info = executor.model_info()
    if (profile.shape.name, profile.shape.dtype, profile.device, profile.block_size) != (
            info.name, info.dtype, executor.device.type, info.block_size):
        raise ValueError(f"{args.out} profiles {profile.shape.name} in {profile.shape.dtype} "
                         f"on {profile.device} with blocks of {profile.block_size}; this "
                         f"executor is {info.name} in {info.dtype} on {executor.device.type} "
                         f"with blocks of {info.block_size}")
    meta = dict(profile.meta or {}, swap_date=datetime.now(timezone.utc).isoformat(
        timespec="seconds"))
    profile = dataclasses.replace(profile, swap=swap, meta=meta)
    profile.save(args.out)
    print(f"{len(swap)} swap sizes added to {args.out}")
    print(profile.host_link().describe())
    return 0
