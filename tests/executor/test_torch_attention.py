"""The torch and cpu backends against a naive dense softmax, with poisoned padding and GQA."""
from __future__ import annotations

import math

import pytest
import torch

from services.executor.attention.base import AttentionMetadata
from services.executor.attention.registry import get_backend


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


@pytest.mark.parametrize("backend", ["torch", "cpu"])
@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (4, 2), (6, 1)])
@pytest.mark.parametrize("block_size", [4, 16])
def test_matches_naive_softmax(backend, heads, kv_heads, block_size):
    q_lens = [1, 7, 1, 1, 20, 1, 3]
    seq_lens = [1, 7, 33, 16, 45, 9, 12]       # prefill, chunk after context, decodes
    q, kc, vc, tables = make_batch(q_lens, seq_lens, block_size, heads, kv_heads, 8)
    meta = AttentionMetadata.build(q_lens, seq_lens, tables)
    got = get_backend(backend).forward(q, kc, vc, meta, 0.3)
    want = naive(q, kc, vc, q_lens, seq_lens, tables, 0.3)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("dim", [64, 80])
def test_cpu_decode_kernel_long_contexts(dtype, dim):
    """Only decode rows, long and ragged contexts, shuffled blocks: the C++ kernel's path."""
    seq_lens = [1, 300, 17, 1024, 64, 255]
    q, kc, vc, tables = make_batch([1] * len(seq_lens), seq_lens, 16, 8, 2, dim, seed=3)
    meta = AttentionMetadata.build([1] * len(seq_lens), seq_lens, tables)
    got = get_backend("cpu").forward(q.to(dtype), kc.to(dtype), vc.to(dtype), meta, dim ** -0.5)
    want = naive(q, kc, vc, [1] * len(seq_lens), seq_lens, tables, dim ** -0.5)
    assert got.dtype == dtype and torch.isfinite(got.float()).all()
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.float(), want, atol=tol, rtol=tol)


def test_cpu_kernel_rejects_a_context_beyond_its_block_table():
    q, kc, vc, tables = make_batch([1], [20], 16, 4, 4, 8)
    meta = AttentionMetadata.build([1], [40], tables)     # 40 tokens need 3 blocks, table has 2
    with pytest.raises(RuntimeError, match="block table"):
        get_backend("cpu").forward(q, kc, vc, meta, 1.0)
