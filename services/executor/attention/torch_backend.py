"""Attention in plain PyTorch over the paged cache: the reference backend, and the CPU one.

One SDPA call per sequence on KV gathered through its block table. A padded batched gather was
tried for decode and measured slower on CPU (the padded copies and their page faults cost more
than the per-sequence calls save), so the loop stays.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from services.executor.attention.base import AttentionBackend, AttentionMetadata


def gather_kv(cache: torch.Tensor, block_table: torch.Tensor, seq_len: int) -> torch.Tensor:
    """``[seq_len, num_kv_heads, head_dim]`` of one sequence from ``cache[num_blocks, bs, h, d]``."""
    block_size = cache.shape[1]
    num_blocks = (seq_len + block_size - 1) // block_size
    blocks = cache[block_table[:num_blocks].long()]
    return blocks.reshape(-1, *cache.shape[2:])[:seq_len]


def attend_one(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """Causal attention of ``q[q_len, H, D]`` sitting at the end of ``k, v[seq_len, Hkv, D]``."""
    q_len, seq_len = q.shape[0], k.shape[0]
    qh, kh, vh = (t.float().transpose(0, 1) for t in (q, k, v))     # [heads, len, D]
    # SDPA's is_causal aligns the mask top-left, which is right only for a whole prompt; a
    # decode row sees every key, and a chunk's row j sits at position seq_len - q_len + j.
    mask, causal = None, 1 < q_len == seq_len
    if 1 < q_len < seq_len:
        q_pos = torch.arange(seq_len - q_len, seq_len, device=q.device)[:, None]
        mask = torch.arange(seq_len, device=q.device)[None, :] <= q_pos
    out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, is_causal=causal,
                                         scale=scale, enable_gqa=kh.shape[0] != qh.shape[0])
    return out.transpose(0, 1).to(q.dtype)


class TorchAttention(AttentionBackend):
    name = "torch"

    def forward(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                meta: AttentionMetadata, scale: float) -> torch.Tensor:
        out = torch.empty_like(q)
        self.attend_sequences(q, k_cache, v_cache, meta, scale, out, range(meta.num_seqs))
        return out

    @staticmethod
    def attend_sequences(q, k_cache, v_cache, meta: AttentionMetadata, scale: float,
                         out: torch.Tensor, seq_ids) -> None:
        """Write the rows of sequences ``seq_ids`` into ``out``, one SDPA call per sequence."""
        starts, seq_lens = meta.query_start_loc.tolist(), meta.seq_lens.tolist()
        for i in seq_ids:
            lo, hi, seq_len = starts[i], starts[i + 1], seq_lens[i]
            if hi > lo:
                table = meta.block_tables[i]
                k, v = gather_kv(k_cache, table, seq_len), gather_kv(v_cache, table, seq_len)
                out[lo:hi] = attend_one(q[lo:hi], k, v, scale)
