"""Fused steps of the decoder layers: one Triton kernel each where the tensors live on a GPU.

On a GPU a decode step of a small model is bound by kernel launches, not by bytes: Llama's
residual add + RMSNorm, RoPE on q and k plus the two KV-cache writes, and SiLU-and-multiply are
about twenty small kernels per layer unfused, three fused. Each kernel reproduces the roundings
of the unfused Hugging Face order in the model's dtype (every product and sum rounded where the
unfused ops round), so greedy outputs stay token-exact. On a CPU, and wherever Triton is missing,
the callers keep the plain torch ops (``use_fused`` says which).
"""
from __future__ import annotations

import os

import torch

try:
    import triton
    import triton.language as tl
    HAVE_TRITON = True
except ImportError:  # pragma: no cover - depends on the environment
    HAVE_TRITON = False

_INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


def use_fused(t: torch.Tensor) -> bool:
    """The fused kernels run on CUDA tensors (and on CPU tensors under the interpreter, which
    only tests ask for explicitly)."""
    return HAVE_TRITON and t.is_cuda


def _pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


if HAVE_TRITON:
    @triton.jit
    def _round(x, DTYPE: tl.constexpr):
        # One rounding to the model dtype, as a separate torch op would do (a no-op in float32).
        return x.to(DTYPE).to(tl.float32)

    @triton.jit
    def _add_rms_norm_kernel(x_ptr, res_ptr, w_ptr, out_ptr, res_out_ptr, n_cols, eps,
                             s_x, s_r, s_o, s_ro, HAS_RES: tl.constexpr, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK)
        mask = cols < n_cols
        dtype = out_ptr.dtype.element_ty
        x = tl.load(x_ptr + row * s_x + cols, mask=mask, other=0.0).to(tl.float32)
        if HAS_RES:
            r = tl.load(res_ptr + row * s_r + cols, mask=mask, other=0.0).to(tl.float32)
            x = _round(x + r, dtype)
            tl.store(res_out_ptr + row * s_ro + cols, x.to(dtype), mask=mask)
        var = tl.sum(x * x, axis=0) / n_cols
        h = _round(x * (1.0 / tl.sqrt_rn(var + eps)), dtype)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(out_ptr + row * s_o + cols, (w * h).to(dtype), mask=mask)

    @triton.jit
    def _rope_cache_kernel(qkv_ptr, pos_ptr, cos_ptr, sin_ptr, slot_ptr, k_ptr, v_ptr,
                           s_qkv, s_cos, s_kb, s_ks, s_kh, s_vb, s_vs, s_vh,
                           NUM_HEADS: tl.constexpr, NUM_KV: tl.constexpr,
                           HEAD_DIM: tl.constexpr, HALF: tl.constexpr, BLOCK_H: tl.constexpr,
                           BLOCK_SIZE: tl.constexpr):
        tok = tl.program_id(0).to(tl.int64)
        head = tl.program_id(1)
        offs = tl.arange(0, BLOCK_H)
        mask = offs < HALF
        dtype = qkv_ptr.dtype.element_ty
        pos = tl.load(pos_ptr + tok)
        # cos/sin rows are cat(freqs, freqs): both halves hold the same angles.
        c = tl.load(cos_ptr + pos * s_cos + offs, mask=mask, other=0.0).to(tl.float32)
        s = tl.load(sin_ptr + pos * s_cos + offs, mask=mask, other=0.0).to(tl.float32)
        base = qkv_ptr + tok * s_qkv + head * HEAD_DIM
        x1 = tl.load(base + offs, mask=mask, other=0.0).to(tl.float32)
        x2 = tl.load(base + HALF + offs, mask=mask, other=0.0).to(tl.float32)
        # q * cos + rotate_half(q) * sin, rotate_half(q) = cat(-x2, x1): each product rounded.
        o1 = _round(_round(x1 * c, dtype) + _round(-x2 * s, dtype), dtype).to(dtype)
        o2 = _round(_round(x2 * c, dtype) + _round(x1 * s, dtype), dtype).to(dtype)
        if head < NUM_HEADS:
            tl.store(base + offs, o1, mask=mask)
            tl.store(base + HALF + offs, o2, mask=mask)
        else:
            kv = head - NUM_HEADS
            slot = tl.load(slot_ptr + tok)
            blk = slot // BLOCK_SIZE
            off = slot % BLOCK_SIZE
            k_dst = k_ptr + blk * s_kb + off * s_ks + kv * s_kh
            tl.store(k_dst + offs, o1, mask=mask)
            tl.store(k_dst + HALF + offs, o2, mask=mask)
            v_src = qkv_ptr + tok * s_qkv + (NUM_HEADS + NUM_KV + kv) * HEAD_DIM
            v_dst = v_ptr + blk * s_vb + off * s_vs + kv * s_vh
            tl.store(v_dst + offs, tl.load(v_src + offs, mask=mask), mask=mask)
            tl.store(v_dst + HALF + offs, tl.load(v_src + HALF + offs, mask=mask), mask=mask)

    @triton.jit
    def _silu_mul_kernel(x_ptr, out_ptr, n_cols, s_x, s_o, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = cols < n_cols
        dtype = out_ptr.dtype.element_ty
        gate = tl.load(x_ptr + row * s_x + cols, mask=mask, other=0.0).to(tl.float32)
        up = tl.load(x_ptr + row * s_x + n_cols + cols, mask=mask, other=0.0).to(tl.float32)
        act = _round(gate / (1.0 + tl.exp(-gate)), dtype)
        tl.store(out_ptr + row * s_o + cols, (act * up).to(dtype), mask=mask)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rms_norm(x + residual), x + residual)``; without a residual, ``(rms_norm(x), x)``."""
    n, cols = x.shape
    out = torch.empty_like(x)
    res_out = torch.empty_like(x) if residual is not None else x
    res = residual if residual is not None else x
    if n:
        _add_rms_norm_kernel[(n,)](x, res, weight, out, res_out, cols, eps, x.stride(0),
                                   res.stride(0), out.stride(0), res_out.stride(0),
                                   HAS_RES=residual is not None, BLOCK=_pow2(cols))
    return out, res_out


def rope_and_cache(qkv: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor,
                   sin: torch.Tensor, slot_mapping: torch.Tensor, k_cache: torch.Tensor,
                   v_cache: torch.Tensor, num_heads: int, num_kv_heads: int,
                   head_dim: int) -> torch.Tensor:
    """Rotate q and k of ``qkv[T, (H + 2 Hkv) * D]`` by their positions' angles (``cos, sin``:
    ``[max_positions, D]`` tables), write k and v to the cache slots, and return the rotated
    ``q[T, H, D]`` (a view into ``qkv``, rotated in place)."""
    n = qkv.shape[0]
    if head_dim % 2 or qkv.stride(1) != 1:
        raise ValueError(f"rope_and_cache needs an even head_dim and a row-major qkv, got "
                         f"head_dim {head_dim}, strides {qkv.stride()}")
    if n:
        _rope_cache_kernel[(n, num_heads + num_kv_heads)](
            qkv, positions, cos, sin, slot_mapping, k_cache, v_cache,
            qkv.stride(0), cos.stride(0), *k_cache.stride()[:3], *v_cache.stride()[:3],
            NUM_HEADS=num_heads, NUM_KV=num_kv_heads, HEAD_DIM=head_dim, HALF=head_dim // 2,
            BLOCK_H=_pow2(head_dim // 2), BLOCK_SIZE=k_cache.shape[1])
    return qkv[:, : num_heads * head_dim].view(n, num_heads, head_dim)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` of ``x[T, 2 I] = [gate | up]``."""
    n, width = x.shape
    cols = width // 2
    out = torch.empty((n, cols), dtype=x.dtype, device=x.device)
    if n:
        block = min(_pow2(cols), 1024)
        _silu_mul_kernel[(n, triton.cdiv(cols, block))](x, out, cols, x.stride(0), out.stride(0),
                                                        BLOCK=block)
    return out
