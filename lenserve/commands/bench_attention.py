"""``lenserve bench-attention``: the Triton paged-attention kernels against PyTorch peers.

Peers per shape: the reference backend (per-sequence gather + einsum, what the kernels replace)
and ``scaled_dot_product_attention`` on KV gathered into contiguous tensors beforehand, an
upper-bound-ish peer that pays neither the block-table indirection nor the gather.
GB/s counts the minimum traffic (q, out, and each sequence's K and V read once).
"""
from __future__ import annotations

import argparse
import os
from dataclasses import dataclass

import torch

DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
DEFAULT_SHAPES = ["decode:1x8192", "decode:32x1024", "decode:64x4096", "decode:8x16384",
                  "prefill:1x2048", "prefill:4x1024", "chunk:8x512+2048"]
CHECK_SHAPES = ["decode:3x40", "prefill:2x24", "chunk:2x8+30"]


@dataclass(frozen=True)
class BenchShape:
    """``batch`` sequences, each with ``q_len`` new rows at the end of ``ctx`` tokens."""
    label: str
    batch: int
    q_len: int
    ctx: int

    @classmethod
    def parse(cls, text: str) -> BenchShape:
        """``decode:BxCTX``, ``prefill:BxLEN`` or ``chunk:BxQ+PAST`` (q rows after PAST)."""
        kind, _, dims = text.partition(":")
        try:
            batch, _, rest = dims.partition("x")
            if kind == "decode":
                return cls(text, int(batch), 1, int(rest))
            if kind == "prefill":
                return cls(text, int(batch), int(rest), int(rest))
            if kind == "chunk":
                q_len, _, past = rest.partition("+")
                return cls(text, int(batch), int(q_len), int(q_len) + int(past))
        except ValueError:
            pass
        raise ValueError(f"bad shape {text!r}: use decode:BxCTX, prefill:BxLEN or chunk:BxQ+PAST")


@dataclass(frozen=True)
class BenchConfig:
    num_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    block_size: int = 16
    dtype: torch.dtype = torch.float16


def build_inputs(shape: BenchShape, cfg: BenchConfig, device: str, seed: int = 0):
    """Random q, a paged cache with shuffled block tables, and the batch's metadata."""
    from services.executor.attention.base import AttentionMetadata

    gen = torch.Generator().manual_seed(seed)
    per_seq = -(-shape.ctx // cfg.block_size)
    num_blocks = shape.batch * per_seq
    tables = torch.randperm(num_blocks, generator=gen).view(shape.batch, per_seq).tolist()
    meta = AttentionMetadata.build([shape.q_len] * shape.batch, [shape.ctx] * shape.batch,
                                   tables, device)
    cache_shape = (num_blocks, cfg.block_size, cfg.num_kv_heads, cfg.head_dim)
    k_cache = torch.randn(cache_shape, generator=gen).to(device, cfg.dtype)
    v_cache = torch.randn(cache_shape, generator=gen).to(device, cfg.dtype)
    q = torch.randn(shape.batch * shape.q_len, cfg.num_heads, cfg.head_dim, generator=gen)
    return q.to(device, cfg.dtype), k_cache, v_cache, meta


def traffic_bytes(shape: BenchShape, cfg: BenchConfig) -> int:
    elem = torch.finfo(cfg.dtype).bits // 8
    kv = 2 * shape.batch * shape.ctx * cfg.num_kv_heads * cfg.head_dim
    q_out = 2 * shape.batch * shape.q_len * cfg.num_heads * cfg.head_dim
    return (kv + q_out) * elem


def sdpa_peer(q, k_cache, v_cache, meta, shape: BenchShape, cfg: BenchConfig):
    """A closure running SDPA on this batch's KV, gathered once outside the timed region."""
    import torch.nn.functional as F

    # SDPA's causal mask is top-left aligned: it fits only when the rows are the whole context.
    if 1 < shape.q_len < shape.ctx:
        return None
    causal = shape.q_len > 1

    def dense(cache):
        blocks = cache[meta.block_tables.long()]  # [B, blocks, bs, Hkv, D]
        seq = blocks.flatten(1, 2)[:, : shape.ctx]
        return seq.transpose(1, 2).contiguous()  # [B, Hkv, ctx, D]

    k, v = dense(k_cache), dense(v_cache)
    qd = q.view(shape.batch, shape.q_len, cfg.num_heads, cfg.head_dim).transpose(1, 2)
    return lambda: F.scaled_dot_product_attention(qd, k, v, is_causal=causal, enable_gqa=True)


def max_error(shape: BenchShape, cfg: BenchConfig, device: str, num_splits: int | None,
              options=None) -> float:
    from services.executor.attention.torch_backend import TorchAttention
    from services.executor.attention.triton_backend import TritonAttention

    q, k_cache, v_cache, meta = build_inputs(shape, cfg, device)
    scale = cfg.head_dim ** -0.5
    ref = TorchAttention().forward(q, k_cache, v_cache, meta, scale)
    out = TritonAttention(num_splits, options).forward(q, k_cache, v_cache, meta, scale)
    return (out.float() - ref.float()).abs().max().item()


def time_row(shape: BenchShape, cfg: BenchConfig, num_splits: int | None, rep_ms: int,
             options=None) -> str:
    from triton.testing import do_bench, do_bench_cudagraph

    from services.executor.attention.torch_backend import TorchAttention
    from services.executor.attention.triton_backend import TritonAttention

    q, k_cache, v_cache, meta = build_inputs(shape, cfg, "cuda")
    args = (q, k_cache, v_cache, meta, cfg.head_dim ** -0.5)
    triton_attn, torch_attn = TritonAttention(num_splits, options), TorchAttention()
    peers = {"triton": lambda: triton_attn.forward(*args),
             "torch-ref": lambda: torch_attn.forward(*args),
             "sdpa-gathered": sdpa_peer(q, k_cache, v_cache, meta, shape, cfg)}
    gbytes = traffic_bytes(shape, cfg) / 1e9
    cells = []
    for name, fn in peers.items():
        if fn is None:
            cells.append(f"{name:>13} {'n/a':>18}")
            continue
        # The kernels and SDPA as a decode step runs them, replayed from a CUDA graph (no
        # launch overhead); the reference syncs with the host, so it is timed eagerly.
        us = (do_bench(fn, warmup=10, rep=rep_ms) if name == "torch-ref"
              else do_bench_cudagraph(fn, rep=rep_ms)) * 1e3
        cells.append(f"{name:>13} {us:9.1f}us {gbytes / (us * 1e-6):6.0f}GB/s")
    return f"{shape.label:<20} " + " | ".join(cells)


def run(args: argparse.Namespace) -> int:
    cfg = BenchConfig(args.num_heads, args.num_kv_heads, args.head_dim, args.block_size,
                      DTYPES[args.dtype])
    if cfg.num_heads % cfg.num_kv_heads:
        raise ValueError(f"--num-heads {cfg.num_heads} is not a multiple of --num-kv-heads "
                         f"{cfg.num_kv_heads}")
    from services.executor.attention.triton_backend import KernelOptions
    options = KernelOptions.parse(args.kernel_option or [])
    on_gpu = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET", "0") != "1"
    shapes = [BenchShape.parse(t) for t in args.shapes or (DEFAULT_SHAPES if on_gpu
                                                            else CHECK_SHAPES)]
    if not on_gpu:
        # Interpreted kernels are correct but orders of magnitude slower: no timing to report.
        # The interpreter must be chosen before triton is imported, so the ``lenserve`` command
        # sets TRITON_INTERPRET at its start when there is no CUDA (see cli.py).
        print("bench-attention: timing needs a GPU with compiled Triton kernels "
              "(no CUDA, or TRITON_INTERPRET=1); running the correctness pass only")
        return check(cfg, shapes, "cpu", args.num_splits, options)
    if args.check:
        return check(cfg, shapes, "cuda", args.num_splits, options)
    print(f"{cfg}\n{options}\nGPU us/call (CUDA graph replays; torch-ref eager) and GB/s of "
          "minimum traffic (q, out, K and V read once)")
    for shape in shapes:
        print(time_row(shape, cfg, args.num_splits, args.rep_ms, options), flush=True)
    return 0


def check(cfg: BenchConfig, shapes: list[BenchShape], device: str,
          num_splits: int | None, options=None) -> int:
    tol = 1e-4 if cfg.dtype == torch.float32 else 3e-2
    worst = 0.0
    for shape in shapes:
        err = max_error(shape, cfg, device, num_splits, options)
        worst = max(worst, err)
        print(f"{shape.label:<20} max |triton - torch| = {err:.2e}")
    ok = worst <= tol
    print(f"correctness: {'ok' if ok else 'FAILED'} (tolerance {tol:g})")
    return 0 if ok else 1


def register(subparsers) -> None:
    p = subparsers.add_parser("bench-attention", help="time the Triton paged-attention kernels")
    p.add_argument("--shapes", nargs="+", metavar="SHAPE",
                   help="decode:BxCTX, prefill:BxLEN or chunk:BxQ+PAST (default: a sweep)")
    p.add_argument("--num-heads", type=int, default=32)
    p.add_argument("--num-kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--dtype", choices=sorted(DTYPES), default="float16")
    p.add_argument("--num-splits", type=int, default=None,
                   help="split-KV factor for decode (power of two; default: chosen per batch)")
    p.add_argument("--kernel-option", nargs="+", metavar="KEY=INT",
                   help="launch shapes, e.g. decode_warps=8 prefill_block_m=128 (see "
                        "KernelOptions in services/executor/attention/triton_backend.py)")
    p.add_argument("--rep-ms", type=int, default=100, help="timing budget per kernel (ms)")
    p.add_argument("--check", action="store_true", help="correctness pass only, no timing")
    p.set_defaults(func=run)
