"""Sweep the Triton attention kernels' launch shapes on a GPU against SDPA on gathered KV.

    python3 scripts/tune_attention.py [--rep-ms 25] [--json out.json]

For each shape of ``lenserve bench-attention``'s default sweep (Llama-7B-like heads) and the
decode shapes of smollm-360m, times every candidate ``KernelOptions`` (GPU time: replays of a
captured CUDA graph, as the decode step runs them, so launch overhead is out) and prints, per shape,
the fraction of SDPA's bandwidth it reaches; then the candidate whose worst shape is best, for
decode and for prefill separately (their options are independent). A candidate that does not
compile (shared memory) is skipped.
"""
from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lenserve.commands.bench_attention import (
    DEFAULT_SHAPES,
    BenchConfig,
    BenchShape,
    build_inputs,
    sdpa_peer,
)
from services.executor.attention.triton_backend import KernelOptions, TritonAttention

LLAMA = BenchConfig(32, 8, 128, 16, torch.bfloat16)
SMOLLM = BenchConfig(15, 5, 64, 16, torch.bfloat16)
SMOLLM_SHAPES = ["decode:1x512", "decode:32x512", "decode:128x512"]


def decode_candidates():
    for tile, warps, stages, (waves, most) in itertools.product(
            (32, 64, 128), (4, 8), (3,), ((2, 16), (4, 64))):
        yield KernelOptions(decode_tile_n=tile, decode_warps=warps, decode_stages=stages,
                            split_waves=waves, max_splits=most)


def prefill_candidates():
    for block_m, tile, warps, stages in itertools.product((64, 128), (32, 64), (4, 8), (2, 3)):
        yield KernelOptions(prefill_block_m=block_m, prefill_tile_n=tile, prefill_warps=warps,
                            prefill_stages=stages)


def main() -> int:
    from triton.testing import do_bench_cudagraph as do_bench
    p = argparse.ArgumentParser()
    p.add_argument("--rep-ms", type=int, default=25)
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    cases = ([(BenchShape.parse(s), LLAMA) for s in DEFAULT_SHAPES]
             + [(BenchShape.parse(s), SMOLLM) for s in SMOLLM_SHAPES])
    results = []
    for shape, cfg in cases:
        q, k, v, meta = build_inputs(shape, cfg, "cuda")
        scale = cfg.head_dim ** -0.5
        peer = sdpa_peer(q, k, v, meta, shape, cfg)
        sdpa_us = do_bench(peer, rep=args.rep_ms) * 1e3 if peer else None
        ref = TritonAttention().forward(q, k, v, meta, scale).float()
        kind = "decode" if shape.q_len == 1 else "prefill"
        cands = decode_candidates() if kind == "decode" else prefill_candidates()
        for opt in cands:
            attn = TritonAttention(options=opt)
            try:
                out = attn.forward(q, k, v, meta, scale).float()
                us = do_bench(lambda a=attn, x=(q, k, v, meta, scale): a.forward(*x),
                              rep=args.rep_ms) * 1e3
            except Exception as exc:  # noqa: BLE001 - out of shared memory and the like
                print(f"skip {opt}: {type(exc).__name__}", file=sys.stderr)
                continue
            err = (out - ref).abs().max().item()
            results.append({"shape": f"{shape.label}/h{cfg.num_heads}", "kind": kind,
                            "options": opt.__dict__, "us": us, "sdpa_us": sdpa_us,
                            "max_err_vs_default": err})
        print(f"done {shape.label} h{cfg.num_heads} (sdpa {sdpa_us})", file=sys.stderr,
              flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    report(results)
    return 0


def report(results: list[dict]) -> None:
    default = KernelOptions().__dict__
    for kind in ("decode", "prefill"):
        rows = [r for r in results if r["kind"] == kind]
        shapes = sorted({r["shape"] for r in rows})
        by_opt: dict[str, dict[str, dict]] = {}
        for r in rows:
            by_opt.setdefault(json.dumps(r["options"], sort_keys=True), {})[r["shape"]] = r

        def worst(opt_rows: dict, rows=rows, shapes=shapes) -> float:
            # Fraction of SDPA's speed where SDPA applies, else of the default's.
            fr = [(x["sdpa_us"] or _default_us(rows, x["shape"], default)) / x["us"]
                  for x in opt_rows.values()]
            return min(fr) if len(opt_rows) == len(shapes) else 0.0
        best = max(by_opt, key=lambda k: worst(by_opt[k]))
        print(f"\n{kind}: best worst-case candidate {best} ({worst(by_opt[best]):.2f})")
        print(f"{'shape':<28} {'default us':>10} {'best us':>9} {'sdpa us':>9} "
              f"{'best/sdpa':>9} {'chosen us':>9} {'chosen/sdpa':>11}")
        for shape in shapes:
            mine = [r for r in rows if r["shape"] == shape]
            top = min(mine, key=lambda r: r["us"])
            d = _default_us(rows, shape, default)
            chosen = by_opt[best][shape]["us"]
            s = top["sdpa_us"]
            print(f"{shape:<28} {d or 0:>10.1f} {top['us']:>9.1f} {s or 0:>9.1f} "
                  f"{(s / top['us']) if s else 0:>9.2f} {chosen:>9.1f} "
                  f"{(s / chosen) if s else 0:>11.2f}")


def _default_us(rows: list[dict], shape: str, default: dict) -> float | None:
    for r in rows:
        if r["shape"] == shape and all(r["options"][k] == v for k, v in default.items()):
            return r["us"]
    return None


if __name__ == "__main__":
    sys.exit(main())
