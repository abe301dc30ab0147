"""Sliding windows and score soft-capping in every attention backend, against a naive dense
softmax over poisoned paged caches: a read of a key outside the window, or of padding, poisons
the output, and a window or cap left unapplied changes it."""
from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest

from services.executor.attention.base import AttentionMetadata
from services.executor.attention.registry import get_backend
from tests.executor.test_torch_attention import make_batch

# Decode rows (one long: its window starts blocks in), a chunk after context, a full prefill
# longer than the window, a short prefill inside it.
Q_LENS = [1, 1, 9, 30, 3]
SEQ_LENS = [5, 61, 40, 30, 3]


def naive(q, k_cache, v_cache, q_lens, seq_lens, tables, scale, window=0, softcap=0.0):
    out, start = [], 0
    bs = k_cache.shape[1]
    for q_len, seq_len, table in zip(q_lens, seq_lens, tables):
        pos = torch.arange(seq_len)
        k = k_cache[torch.tensor(table)[pos // bs], pos % bs]
        v = v_cache[torch.tensor(table)[pos // bs], pos % bs]
        group = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
        for j in range(q_len):
            qp = seq_len - q_len + j
            lo = max(0, qp - window + 1) if window else 0
            s = torch.einsum("hd,lhd->hl", q[start + j], k[lo: qp + 1]) * scale
            if softcap:
                s = softcap * torch.tanh(s / softcap)
            out.append(torch.einsum("hl,lhd->hd", torch.softmax(s, -1), v[lo: qp + 1]))
        start += q_len
    return torch.stack(out)


def _poison_outside_windows(k_cache, tables, seq_lens, q_lens, window, bs):
    """NaN every key no query can see through the window: reading one fails the test."""
    for table, seq_len, q_len in zip(tables, seq_lens, q_lens):
        for p in range(max(0, seq_len - q_len - window + 1)):
            k_cache[table[p // bs], p % bs] = float("nan")


def _backends():
    return ["torch", "cpu", pytest.param("triton", marks=pytest.mark.skipif(
        os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available(),
        reason="needs CUDA or TRITON_INTERPRET=1"))]


@pytest.mark.parametrize("backend", _backends())
@pytest.mark.parametrize("window,softcap", [(8, 0.0), (0, 2.0), (13, 1.5)])
def test_window_and_softcap_match_naive(backend, window, softcap):
    bs, heads, kv_heads, dim = 4, 4, 2, 16
    q, kc, vc, tables = make_batch(Q_LENS, SEQ_LENS, bs, heads, kv_heads, dim, seed=5)
    q = q * 3   # wide scores: the cap bites
    want = naive(q, kc, vc, Q_LENS, SEQ_LENS, tables, 0.5, window, softcap)
    plain = naive(q, kc, vc, Q_LENS, SEQ_LENS, tables, 0.5)
    assert not torch.allclose(want, plain, atol=1e-3)      # the scenario exercises the option
    if window:
        _poison_outside_windows(kc, tables, SEQ_LENS, Q_LENS, window, bs)
    meta = AttentionMetadata.build(Q_LENS, SEQ_LENS, tables)
    got = get_backend(backend).forward(q, kc, vc, meta, 0.5, window=window, softcap=softcap)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_triton_split_decode_honours_the_window():
    from services.executor.attention.triton_backend import TritonAttention
    q_lens, seq_lens = [1, 1], [70, 9]
    q, kc, vc, tables = make_batch(q_lens, seq_lens, 8, 4, 4, 16, seed=2)
    want = naive(q, kc, vc, q_lens, seq_lens, tables, 0.25, 20)
    _poison_outside_windows(kc, tables, seq_lens, q_lens, 20, 8)
    meta = AttentionMetadata.build(q_lens, seq_lens, tables)
    got = TritonAttention(num_splits=4).forward(q, kc, vc, meta, 0.25, window=20)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
