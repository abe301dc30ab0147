"""The torch backend against a naive dense softmax, with poisoned padding and GQA."""
from __future__ import annotations

import math

import pytest
import torch

from services.executor.attention.base import AttentionMetadata
from services.executor.attention.torch_backend import TorchAttention


def naive(q, k_cache, v_cache, q_lens, seq_lens, tables, scale):
    out, start = [], 0
    bs = k_cache.shape[1]
    for q_len, seq_len, table in zip(q_lens, seq_lens, tables):
        pos = torch.arange(seq_len)
        k = k_cache[torch.tensor(table)[pos // bs], pos % bs]       # [L, Hkv, D]
        v = v_cache[torch.tensor(table)[pos // bs], pos % bs]
        group = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
        for j in range(q_len):
            qp = seq_len - q_len + j
            s = torch.einsum("hd,lhd->hl", q[start + j], k[: qp + 1]) * scale
            out.append(torch.einsum("hl,lhd->hd", torch.softmax(s, -1), v[: qp + 1]))
        start += q_len
    return torch.stack(out)


def make_batch(q_lens, seq_lens, block_size, heads, kv_heads, dim, seed=0):
    g = torch.Generator().manual_seed(seed)
    need = [math.ceil(s / block_size) for s in seq_lens]
    num_blocks = sum(need) + 4
    perm = torch.randperm(num_blocks, generator=g).tolist()
    tables, used = [], 0
    for n in need:
        tables.append(perm[used: used + n])
        used += n
    k_cache = torch.full((num_blocks, block_size, kv_heads, dim), float("nan"))
    v_cache = torch.full_like(k_cache, float("nan"))
    for table, seq_len in zip(tables, seq_lens):   # only real positions hold numbers
        for p in range(seq_len):
            k_cache[table[p // block_size], p % block_size] = torch.randn(kv_heads, dim, generator=g)
            v_cache[table[p // block_size], p % block_size] = torch.randn(kv_heads, dim, generator=g)
    q = torch.randn(sum(q_lens), heads, dim, generator=g)
    return q, k_cache, v_cache, tables


@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (4, 2), (6, 1)])
@pytest.mark.parametrize("block_size", [4, 16])
def test_matches_naive_softmax(heads, kv_heads, block_size):
    q_lens = [1, 7, 1, 1, 20, 1, 3]
    seq_lens = [1, 7, 33, 16, 45, 9, 12]       # prefill, chunk after context, decodes
    q, kc, vc, tables = make_batch(q_lens, seq_lens, block_size, heads, kv_heads, 8)
    meta = AttentionMetadata.build(q_lens, seq_lens, tables)
    got = TorchAttention().forward(q, kc, vc, meta, 0.3)
    want = naive(q, kc, vc, q_lens, seq_lens, tables, 0.3)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
