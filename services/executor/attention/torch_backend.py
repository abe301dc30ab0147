"""Attention in plain PyTorch over the paged cache: the reference backend, and the CPU one.

One SDPA call per sequence on KV gathered through its block table. A padded batched gather was
tried for decode and measured slower on CPU (the padded copies and their page faults cost more
than the per-sequence calls save), so the loop stays.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from services.executor.attention.base import AttentionBackend, AttentionMetadata


def gather_kv(cache: torch.Tensor, block_table: torch.Tensor, seq_len: int,
              start: int = 0) -> torch.Tensor:
    """``[seq_len - start, num_kv_heads, head_dim]``: positions ``start..seq_len-1`` of one
    sequence from ``cache[num_blocks, bs, h, d]`` (blocks wholly before ``start`` unread)."""
    block_size = cache.shape[1]
    first, num_blocks = start // block_size, (seq_len + block_size - 1) // block_size
    blocks = cache[block_table[first:num_blocks].long()]
    skip = first * block_size
    return blocks.reshape(-1, *cache.shape[2:])[start - skip: seq_len - skip]


def attend_one(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
               window: int = 0, softcap: float = 0.0, first_key: int = 0) -> torch.Tensor:
    """Causal attention of ``q[q_len, H, D]`` sitting at the end of ``k, v[n, Hkv, D]``, whose
    first row is position ``first_key`` of the sequence (keys before it left out by a window)."""
    q_len, n = q.shape[0], k.shape[0]
    seq_len = first_key + n
    qh, kh, vh = (t.float().transpose(0, 1) for t in (q, k, v))     # [heads, len, D]
    # SDPA's is_causal aligns the mask top-left, which is right only for a whole prompt; a
    # decode row sees every key, and a chunk's row j sits at position seq_len - q_len + j.
    mask, causal = None, 1 < q_len == n and not window
    if (1 < q_len and not causal) or window or softcap:
        q_pos = torch.arange(seq_len - q_len, seq_len, device=q.device)[:, None]
        k_pos = torch.arange(first_key, seq_len, device=q.device)[None, :]
        mask = k_pos <= q_pos
        if window:
            mask &= k_pos > q_pos - window
    if softcap:
        # SDPA has no score hook: the scores in full, in the order of Hugging Face's eager path.
        if kh.shape[0] != qh.shape[0]:
            group = qh.shape[0] // kh.shape[0]
            kh, vh = kh.repeat_interleave(group, 0), vh.repeat_interleave(group, 0)
        s = torch.matmul(qh, kh.transpose(1, 2)) * scale
        s = torch.tanh(s / softcap) * softcap
        s = s.masked_fill(~mask, float("-inf"))
        out = torch.matmul(torch.softmax(s, dim=-1), vh)
    else:
        out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, is_causal=causal,
                                             scale=scale, enable_gqa=kh.shape[0] != qh.shape[0])
    return out.transpose(0, 1).to(q.dtype)


def window_start(seq_len: int, q_len: int, window: int) -> int:
    """The first position any of the last ``q_len`` queries sees through a ``window``."""
    return max(0, seq_len - q_len - window + 1) if window else 0


class TorchAttention(AttentionBackend):
    name = "torch"

    def forward(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                meta: AttentionMetadata, scale: float, window: int = 0,
                softcap: float = 0.0) -> torch.Tensor:
        out = torch.empty_like(q)
        self.attend_sequences(q, k_cache, v_cache, meta, scale, out, range(meta.num_seqs),
                              window, softcap)
        return out

    @staticmethod
    def attend_sequences(q, k_cache, v_cache, meta: AttentionMetadata, scale: float,
                         out: torch.Tensor, seq_ids, window: int = 0,
                         softcap: float = 0.0) -> None:
        """Write the rows of sequences ``seq_ids`` into ``out``, one SDPA call per sequence;
        a window gathers only the keys some query of the sequence can see."""
        starts, seq_lens = meta.query_start_loc.tolist(), meta.seq_lens.tolist()
        for i in seq_ids:
            lo, hi, seq_len = starts[i], starts[i + 1], seq_lens[i]
            if hi > lo:
                table = meta.block_tables[i]
                first = window_start(seq_len, hi - lo, window)
                k = gather_kv(k_cache, table, seq_len, first)
                v = gather_kv(v_cache, table, seq_len, first)
                out[lo:hi] = attend_one(q[lo:hi], k, v, scale, window, softcap, first)
