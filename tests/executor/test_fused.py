"""The fused decoder kernels compute exactly what the unfused torch ops compute.

On a machine without a GPU they run in Triton's interpreter (TRITON_INTERPRET=1, as the test
command sets); on a GPU, on the GPU. Inputs are fresh random values, outputs are poisoned first.
"""
from __future__ import annotations

import importlib.util
import os

import pytest
import torch

from services.executor.models.layers import RMSNorm, apply_rope, rope_cos_sin

needs_triton = pytest.mark.skipif(
    importlib.util.find_spec("triton") is None
    or (not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1"),
    reason="needs triton on a GPU or TRITON_INTERPRET=1")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float32] + ([torch.bfloat16, torch.float16] if DEVICE == "cuda" else [])


def _close(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype) -> None:
    # float32: a different reduction order only; half types: at most one rounding step.
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    assert torch.isfinite(a).all()
    torch.testing.assert_close(a.float(), b.float(), rtol=tol, atol=tol)


@needs_triton
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_residual", [False, True])
def test_add_rms_norm_matches_the_unfused_norm(dtype, with_residual):
    from services.executor.models.fused import add_rms_norm
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(7, 96, generator=gen).to(DEVICE, dtype)
    res = torch.randn(7, 96, generator=gen).to(DEVICE, dtype) if with_residual else None
    norm = RMSNorm(96, 1e-5).to(DEVICE, dtype)
    with torch.no_grad():
        norm.weight.copy_(torch.rand(96, generator=gen) + 0.5)
    out, summed = add_rms_norm(x, res, norm.weight, norm.eps)
    ref_sum = x + res if with_residual else x
    assert torch.equal(summed, ref_sum)
    _close(out, norm.norm(ref_sum), dtype)


@needs_triton
@pytest.mark.parametrize("dtype", DTYPES)
def test_rope_and_cache_rotates_q_and_writes_k_v_to_their_slots(dtype):
    from services.executor.models.fused import rope_and_cache
    heads, kv_heads, dim, bs, blocks, n = 6, 2, 32, 4, 5, 9
    gen = torch.Generator().manual_seed(2)
    qkv = torch.randn(n, (heads + 2 * kv_heads) * dim, generator=gen).to(DEVICE, dtype)
    positions = torch.randint(0, 60, (n,), generator=gen).to(DEVICE)
    slots = torch.randperm(blocks * bs, generator=gen)[:n].to(DEVICE)
    cos, sin = rope_cos_sin(torch.arange(64, device=DEVICE), dim, 10000.0, dtype)
    k_cache = torch.full((blocks, bs, kv_heads, dim), float("nan"), dtype=dtype, device=DEVICE)
    v_cache = k_cache.clone()
    q_ref, k_ref, v = qkv.clone().split([heads * dim, kv_heads * dim, kv_heads * dim], -1)
    c, s = cos[positions], sin[positions]
    q_ref = apply_rope(q_ref.reshape(n, heads, dim), c, s)
    k_ref = apply_rope(k_ref.reshape(n, kv_heads, dim), c, s)
    q = rope_and_cache(qkv, positions, cos, sin, slots, k_cache, v_cache, heads, kv_heads, dim)
    _close(q, q_ref, dtype)
    flat_k, flat_v = k_cache.view(-1, kv_heads, dim), v_cache.view(-1, kv_heads, dim)
    _close(flat_k[slots], k_ref, dtype)
    assert torch.equal(flat_v[slots], v.reshape(n, kv_heads, dim))
    untouched = torch.ones(blocks * bs, dtype=torch.bool, device=DEVICE)
    untouched[slots] = False
    assert torch.isnan(flat_k[untouched]).all() and torch.isnan(flat_v[untouched]).all()


@needs_triton
@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_and_mul_matches_the_unfused_ops(dtype):
    from services.executor.models.fused import silu_and_mul
    gen = torch.Generator().manual_seed(3)
    x = (torch.randn(5, 2 * 1300, generator=gen) * 4).to(DEVICE, dtype)
    gate, up = x.split(1300, dim=-1)
    _close(silu_and_mul(x), torch.nn.functional.silu(gate) * up, dtype)


@needs_triton
def test_rope_and_cache_refuses_an_odd_head_dim():
    from services.executor.models.fused import rope_and_cache
    qkv = torch.zeros(2, 3 * 5, device=DEVICE)
    cache = torch.zeros(2, 4, 1, 5, device=DEVICE)
    with pytest.raises(ValueError, match="even head_dim"):
        rope_and_cache(qkv, torch.zeros(2, dtype=torch.long, device=DEVICE),
                       torch.zeros(8, 5, device=DEVICE), torch.zeros(8, 5, device=DEVICE),
                       torch.zeros(2, dtype=torch.long, device=DEVICE), cache, cache, 1, 1, 5)
