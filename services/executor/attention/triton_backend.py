"""lenserve's Triton attention: paged decode and (chunked-)prefill kernels behind one backend."""
from __future__ import annotations

from dataclasses import dataclass, fields
from functools import cache

import torch

from services.executor.attention.base import AttentionBackend, AttentionMetadata
from services.executor.attention.triton_kernels import (
    INTERPRETED,
    MIXED_MODES,
    paged_decode,
    paged_prefill,
)

_MAX_SPLITS = 64


@dataclass(frozen=True)
class KernelOptions:
    """Launch shapes of the two kernels (``lenserve bench-attention --kernel-option`` tunes
    them; ``scripts/tune_attention.py`` sweeps them). ``split_waves``: decode splits long
    contexts until its programs fill the GPU this many times over. ``decode_tile_n`` 0: 32
    keys per step for batches of up to 8 sequences, 64 above (the defaults are the best
    worst-case candidates of that sweep on an H100, against SDPA on gathered KV)."""

    decode_tile_n: int = 0
    decode_warps: int = 4
    decode_stages: int = 3
    prefill_tile_n: int = 32
    prefill_block_m: int = 128
    prefill_warps: int = 8
    prefill_stages: int = 2
    split_waves: int = 4
    max_splits: int = _MAX_SPLITS

    def decode_tile(self, num_seqs: int) -> int:
        return self.decode_tile_n or (32 if num_seqs <= 8 else 64)

    @classmethod
    def parse(cls, items: list[str]) -> KernelOptions:
        known = {f.name for f in fields(cls)}
        values = {}
        for item in items:
            key, sep, value = item.partition("=")
            if not sep or key not in known or not value.isdigit():
                raise ValueError(f"bad kernel option {item!r}: use KEY=INT with KEY one of "
                                 f"{sorted(known)}")
            values[key] = int(value)
        return cls(**values)


@cache
def _num_sms(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def choose_num_splits(num_seqs: int, num_kv_heads: int, max_seq_len: int, device: torch.device,
                      tile_n: int = 32, waves: int = 2, max_splits: int = _MAX_SPLITS) -> int:
    """Split-KV factor for decode: enough programs to cover the GPU twice, no more.

    Few sequences with long contexts leave most SMs idle without a split; many sequences fill
    the GPU anyway and a split would only add the merge pass. Powers of two keep the number of
    compiled variants small."""
    if device.type != "cuda":
        return 1
    programs = max(num_seqs * num_kv_heads, 1)
    want = min(waves * _num_sms(device.index or 0) // programs, max_seq_len // (4 * tile_n))
    splits = 1
    while splits * 2 <= min(want, max_splits):
        splits *= 2
    return splits


class TritonAttention(AttentionBackend):
    """Sequences with one query row go to the decode kernel, the others to the prefill kernel.

    Both kernels are launched over the whole batch and skip the sequences of the other kind on
    the device, so ``forward`` does no per-sequence host work and never syncs."""

    name = "triton"
    graph_safe = True

    def __init__(self, num_splits: int | None = None, options: KernelOptions | None = None
                 ) -> None:
        if num_splits is not None and (num_splits < 1 or num_splits & (num_splits - 1)):
            raise ValueError(f"num_splits must be a power of two >= 1, got {num_splits}")
        self.options = options = options or KernelOptions()
        for name in ("decode_tile_n", "prefill_tile_n", "max_splits"):
            value = getattr(options, name)
            if name == "decode_tile_n" and value == 0:   # chosen per batch
                continue
            # tl.arange needs a power of two, tl.dot at least 16.
            if value < (1 if name == "max_splits" else 16) or value & (value - 1):
                raise ValueError(f"{name} must be a power of two >= 16, got {value}")
        self.num_splits = num_splits

    def decode_splits(self, num_seqs: int, num_kv_heads: int, max_seq_len: int,
                      device: torch.device) -> int:
        o = self.options
        return self.num_splits or choose_num_splits(num_seqs, num_kv_heads, max_seq_len, device,
                                                    o.decode_tile(num_seqs), o.split_waves,
                                                    o.max_splits)

    def forward(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                meta: AttentionMetadata, scale: float, window: int = 0,
                softcap: float = 0.0) -> torch.Tensor:
        _check_inputs(q, k_cache, v_cache, meta)
        out = torch.empty_like(q)
        if q.shape[0] == 0 or meta.num_seqs == 0:
            return out
        args = (out, q, k_cache, v_cache, meta.query_start_loc, meta.seq_lens,
                meta.block_tables, scale)
        o = self.options
        splits = meta.num_splits or self.decode_splits(
            meta.num_seqs, k_cache.shape[2],
            min(meta.max_seq_len, window) if window else meta.max_seq_len, q.device)
        paged_decode(*args, num_splits=splits, tile_n=o.decode_tile(meta.num_seqs),
                     num_warps=o.decode_warps, num_stages=o.decode_stages, window=window,
                     softcap=softcap)
        if meta.max_query_len > 1:
            paged_prefill(*args, max_query_len=meta.max_query_len, block_m=o.prefill_block_m,
                          tile_n=o.prefill_tile_n, num_warps=o.prefill_warps,
                          num_stages=o.prefill_stages, window=window, softcap=softcap)
        return out


def _check_inputs(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                  meta: AttentionMetadata) -> None:
    if q.dim() != 3 or k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        raise ValueError(f"expected q[T, H, D] and k/v caches [N, bs, Hkv, D] of one shape, got "
                         f"q {tuple(q.shape)}, k {tuple(k_cache.shape)}, v {tuple(v_cache.shape)}")
    if q.shape[2] != k_cache.shape[3] or q.shape[1] % k_cache.shape[2]:
        raise ValueError(f"q heads/head_dim {tuple(q.shape[1:])} do not fit the cache's "
                         f"kv heads/head_dim {tuple(k_cache.shape[2:])}")
    if not (q.dtype == k_cache.dtype == v_cache.dtype):
        raise ValueError(f"q, k_cache, v_cache dtypes differ: {q.dtype}, {k_cache.dtype}, "
                         f"{v_cache.dtype}")
    if q.stride(2) != 1 or k_cache.stride(3) != 1 or v_cache.stride(3) != 1:
        raise ValueError("q and the caches need a contiguous head_dim")
    for name in ("query_start_loc", "seq_lens", "block_tables"):
        t = getattr(meta, name)
        if t.device != q.device or t.dtype != torch.int32:
            raise ValueError(f"meta.{name} must be int32 on {q.device}, got {t.dtype} on {t.device}")
    if MIXED_MODES:
        raise RuntimeError("TRITON_INTERPRET was set after triton was imported (torch and "
                           "transformers import it): set it before the process imports them")
    if q.device.type == "cpu" and not INTERPRETED:
        raise RuntimeError("Triton attention on CPU tensors needs TRITON_INTERPRET=1 set before "
                           "triton is imported; without it Triton needs a GPU")
