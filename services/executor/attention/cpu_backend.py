"""The CPU backend: decode rows through the C++ paged kernel, prefill chunks through SDPA.

Decode rows (one query token, attending to the whole context) of every sequence go to one call
of the compiled kernel (``cpu_kernels.paged_decode``), which reads K and V in place through the
block tables. Prefill and chunked-prefill rows are compute-bound and keep the per-sequence SDPA
path of the torch backend, whose matrix products use the CPU's BLAS.
"""
from __future__ import annotations

import torch

from services.executor.attention import cpu_kernels
from services.executor.attention.base import AttentionMetadata
from services.executor.attention.torch_backend import TorchAttention


class CpuAttention(TorchAttention):
    name = "cpu"

    def __init__(self):
        cpu_kernels.load()      # build (or load the cached build) now, not inside a step

    def forward(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                meta: AttentionMetadata, scale: float, window: int = 0,
                softcap: float = 0.0) -> torch.Tensor:
        if q.device.type != "cpu":
            return super().forward(q, k_cache, v_cache, meta, scale, window, softcap)
        q = q.contiguous()
        out = torch.empty_like(q)
        q_lens = meta.query_lens
        decode = torch.nonzero(q_lens == 1).flatten()
        if decode.numel():
            cpu_kernels.paged_decode(
                q, k_cache, v_cache, meta.block_tables[decode].contiguous(),
                meta.seq_lens[decode].contiguous(),
                meta.query_start_loc[decode].contiguous(), scale, out, window, softcap)
        if decode.numel() < meta.num_seqs:
            self.attend_sequences(q, k_cache, v_cache, meta, scale, out,
                                  torch.nonzero(q_lens > 1).flatten().tolist(), window, softcap)
        return out
