"""Reference attention in plain PyTorch: gathers each sequence's KV from its blocks."""
from __future__ import annotations

import torch

from services.executor.attention.base import AttentionBackend, AttentionMetadata


def gather_kv(cache: torch.Tensor, block_table: torch.Tensor, seq_len: int) -> torch.Tensor:
    """``[seq_len, num_kv_heads, head_dim]`` of one sequence from ``cache[num_blocks, bs, h, d]``."""
    block_size = cache.shape[1]
    num_blocks = (seq_len + block_size - 1) // block_size
    blocks = cache[block_table[:num_blocks].long()]
    return blocks.reshape(-1, *cache.shape[2:])[:seq_len]


def attend_one(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """Causal attention of ``q[q_len, H, D]`` sitting at the end of ``k, v[seq_len, Hkv, D]``."""
    q_len, num_heads, _ = q.shape
    seq_len, num_kv_heads, _ = k.shape
    group = num_heads // num_kv_heads
    if group > 1:
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.float(), k.float()) * scale
    q_pos = torch.arange(seq_len - q_len, seq_len, device=q.device)[:, None]
    k_pos = torch.arange(seq_len, device=q.device)[None, :]
    scores.masked_fill_(k_pos > q_pos, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    return torch.einsum("hqk,khd->qhd", probs, v.float()).to(q.dtype)


class TorchAttention(AttentionBackend):
    name = "torch"

    def forward(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                meta: AttentionMetadata, scale: float) -> torch.Tensor:
        out = torch.empty_like(q)
        starts = meta.query_start_loc.tolist()
        lens = meta.seq_lens.tolist()
        for i, seq_len in enumerate(lens):
            lo, hi = starts[i], starts[i + 1]
            if hi == lo:
                continue
            table = meta.block_tables[i]
            k = gather_kv(k_cache, table, seq_len)
            v = gather_kv(v_cache, table, seq_len)
            out[lo:hi] = attend_one(q[lo:hi], k, v, scale)
        return out
