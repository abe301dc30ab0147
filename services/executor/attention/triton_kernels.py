"""Triton kernels for attention over the paged KV cache (layout in ``base.py``).

Both kernels launch one program per (sequence, ...) for *every* sequence of the batch and let
the programs of the other kind return at once. That keeps the host free of per-sequence work
and of device-to-host syncs: which sequences decode is read on the device from
``query_start_loc``, never gathered into index tensors on the host.

* ``paged_decode`` — one query row per sequence; a program owns one KV head and the query heads
  that share it (GQA), so each key/value tile is loaded once per group. Long contexts can be
  split over several programs (split-KV) whose partial results ``_decode_reduce`` merges.
* ``paged_prefill`` — q_len >= 2 rows at the end of the context (prefill or chunked prefill),
  causal. A program owns a tile of query tokens times the heads of one KV head, flattened into
  the M dimension of ``tl.dot``.

A sliding window (``WINDOW`` > 0) starts each key loop at the first position some query of
the program can see, so tiles wholly outside the window are never read; ``SOFTCAP`` > 0 caps
the scaled scores with tanh (Gemma 2). Both are compile-time constants, 0 for none.

Keys are read in tiles of ``TILE_N`` positions that may span several cache blocks: each
position looks up its own block in the block table, so tile width does not depend on the
block size (any block size works, also non powers of two). Softmax is online, in float32.
"""
from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "the 'triton' attention backend needs the triton package: pip install 'lenserve[triton]'"
    ) from exc


@triton.jit
def _kv_tile(cache_ptr, bt_row_ptr, pos, kv_head, offs_d, seq_len,
             s_blk, s_slot, s_head, BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr):
    """``[TILE_N, BLOCK_D]`` keys or values at positions ``pos``, zeros past ``seq_len``."""
    valid = pos < seq_len
    # Padding entries of the block table may hold anything: never read them.
    blk = tl.load(bt_row_ptr + pos // BLOCK_SIZE, mask=valid, other=0).to(tl.int64)
    ptrs = (cache_ptr + blk[:, None] * s_blk + (pos % BLOCK_SIZE)[:, None] * s_slot
            + kv_head * s_head + offs_d[None, :])
    return tl.load(ptrs, mask=valid[:, None] & (offs_d[None, :] < HEAD_DIM), other=0.0)


@triton.jit
def _cap(s, SOFTCAP: tl.constexpr):
    """``SOFTCAP * tanh(s / SOFTCAP)``, tanh from one exp of a non-positive argument (no
    overflow); ``s`` unchanged when SOFTCAP is 0."""
    if SOFTCAP > 0:
        x = s / SOFTCAP
        e = tl.exp(-2.0 * tl.abs(x))
        t = (1.0 - e) / (1.0 + e)
        s = SOFTCAP * tl.where(x < 0, -t, t)
    return s


@triton.jit
def _decode_kernel(
    q_ptr, k_ptr, v_ptr, out_ptr, part_out_ptr, part_lse_ptr,
    qsl_ptr, seq_lens_ptr, bt_ptr, scale,
    s_qt, s_qh, s_ot, s_oh, s_kb, s_ks, s_kh, s_vb, s_vs, s_vh, s_bt,
    GROUP: tl.constexpr, BLOCK_G: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, TILE_N: tl.constexpr, NUM_SPLITS: tl.constexpr,
    DOT_PRECISION: tl.constexpr, UPCAST: tl.constexpr, WINDOW: tl.constexpr,
    SOFTCAP: tl.constexpr,
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    row = tl.load(qsl_ptr + seq)
    if tl.load(qsl_ptr + seq + 1) - row != 1:
        return
    seq_len = tl.load(seq_lens_ptr + seq)
    offs_g = tl.arange(0, BLOCK_G)
    offs_d = tl.arange(0, BLOCK_D)
    heads = kv_head * GROUP + offs_g
    hd_mask = (offs_g[:, None] < GROUP) & (offs_d[None, :] < HEAD_DIM)
    q = tl.load(q_ptr + row * s_qt + heads[:, None] * s_qh + offs_d[None, :], mask=hd_mask,
                other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    first = 0
    if WINDOW > 0:
        first = tl.maximum(seq_len - WINDOW, 0)
    num_tiles = tl.cdiv(seq_len - first, TILE_N)
    tiles_per_split = tl.cdiv(num_tiles, NUM_SPLITS)
    lo = first + split * tiles_per_split * TILE_N
    hi = tl.minimum(lo + tiles_per_split * TILE_N, seq_len)
    bt_row = bt_ptr + seq.to(tl.int64) * s_bt
    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    for start in range(lo, hi, TILE_N):
        pos = start + tl.arange(0, TILE_N)
        k = _kv_tile(k_ptr, bt_row, pos, kv_head, offs_d, seq_len, s_kb, s_ks, s_kh,
                     BLOCK_SIZE, HEAD_DIM)
        v = _kv_tile(v_ptr, bt_row, pos, kv_head, offs_d, seq_len, s_vb, s_vs, s_vh,
                     BLOCK_SIZE, HEAD_DIM)
        if UPCAST:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        # The group is padded to 16 rows for tl.dot: wasted MMA work is free in a
        # bandwidth-bound kernel, and it keeps the [G, N, D] product out of registers.
        s = _cap(tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale, SOFTCAP)
        s = tl.where((pos < seq_len)[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        p = tl.exp(s - m_new[:, None])
        alpha = tl.exp(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new
    if NUM_SPLITS == 1:
        out = acc / l_i[:, None]
        tl.store(out_ptr + row * s_ot + heads[:, None] * s_oh + offs_d[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=hd_mask)
    else:
        # An empty split (short context) leaves l_i == 0: weight -inf, contributes nothing.
        has = l_i > 0
        out = tl.where(has[:, None], acc / tl.where(has, l_i, 1.0)[:, None], 0.0)
        lse = tl.where(has, m_i + tl.log(tl.where(has, l_i, 1.0)), float("-inf"))
        base = (seq * tl.num_programs(1) * GROUP + heads) * NUM_SPLITS + split
        tl.store(part_lse_ptr + base, lse, mask=offs_g < GROUP)
        tl.store(part_out_ptr + base[:, None] * BLOCK_D + offs_d[None, :], out, mask=hd_mask)


@triton.jit
def _decode_reduce(
    out_ptr, part_out_ptr, part_lse_ptr, qsl_ptr, s_ot, s_oh, num_heads,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, NUM_SPLITS: tl.constexpr,
):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    row = tl.load(qsl_ptr + seq)
    if tl.load(qsl_ptr + seq + 1) - row != 1:
        return
    offs_s = tl.arange(0, NUM_SPLITS)
    offs_d = tl.arange(0, BLOCK_D)
    base = (seq * num_heads + head) * NUM_SPLITS + offs_s
    lse = tl.load(part_lse_ptr + base)
    weight = tl.exp(lse - tl.max(lse, axis=0))
    part = tl.load(part_out_ptr + base[:, None] * BLOCK_D + offs_d[None, :])
    out = tl.sum(part * weight[:, None], axis=0) / tl.sum(weight, axis=0)
    tl.store(out_ptr + row * s_ot + head * s_oh + offs_d, out.to(out_ptr.dtype.element_ty),
             mask=offs_d < HEAD_DIM)


@triton.jit
def _prefill_kernel(
    q_ptr, k_ptr, v_ptr, out_ptr, qsl_ptr, seq_lens_ptr, bt_ptr, scale,
    s_qt, s_qh, s_ot, s_oh, s_kb, s_ks, s_kh, s_vb, s_vs, s_vh, s_bt,
    GROUP: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_M: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_SIZE: tl.constexpr, TILE_N: tl.constexpr,
    DOT_PRECISION: tl.constexpr, UPCAST: tl.constexpr, WINDOW: tl.constexpr,
    SOFTCAP: tl.constexpr,
):
    seq = tl.program_id(0)
    q_tile = tl.program_id(1)
    kv_head = tl.program_id(2)
    q_start = tl.load(qsl_ptr + seq)
    q_len = tl.load(qsl_ptr + seq + 1) - q_start
    if (q_len < 2) | (q_tile * BLOCK_Q >= q_len):
        return
    seq_len = tl.load(seq_lens_ptr + seq)
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    q_idx = q_tile * BLOCK_Q + offs_m // GROUP
    heads = kv_head * GROUP + offs_m % GROUP
    row_ok = (offs_m < BLOCK_Q * GROUP) & (q_idx < q_len)
    # Dead rows borrow the last live position so every row sees key 0 and stays finite.
    q_pos = seq_len - q_len + tl.minimum(q_idx, q_len - 1)
    rows = (q_start + q_idx).to(tl.int64)
    md_mask = row_ok[:, None] & (offs_d[None, :] < HEAD_DIM)
    q = tl.load(q_ptr + rows[:, None] * s_qt + heads[:, None] * s_qh + offs_d[None, :],
                mask=md_mask, other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    kv_end = tl.minimum(seq_len - q_len + (q_tile + 1) * BLOCK_Q, seq_len)
    bt_row = bt_ptr + seq.to(tl.int64) * s_bt
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    kv_start = 0
    if WINDOW > 0:
        # The tile's first query sees the lowest keys: nothing before its window is read.
        kv_start = tl.maximum(seq_len - q_len + q_tile * BLOCK_Q - WINDOW + 1, 0)
    for start in range(kv_start, kv_end, TILE_N):
        pos = start + tl.arange(0, TILE_N)
        k = _kv_tile(k_ptr, bt_row, pos, kv_head, offs_d, seq_len, s_kb, s_ks, s_kh,
                     BLOCK_SIZE, HEAD_DIM)
        v = _kv_tile(v_ptr, bt_row, pos, kv_head, offs_d, seq_len, s_vb, s_vs, s_vh,
                     BLOCK_SIZE, HEAD_DIM)
        if UPCAST:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        s = _cap(tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale, SOFTCAP)
        seen = pos[None, :] <= q_pos[:, None]
        if WINDOW > 0:
            seen = seen & (pos[None, :] > q_pos[:, None] - WINDOW)
        s = tl.where(seen, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        if WINDOW > 0:
            # A row whose window starts past this tile has seen no key yet: keep it at zero
            # weight instead of exp(-inf - -inf).
            m_new = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp(s - m_new[:, None])
        alpha = tl.exp(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new
    out = acc / l_i[:, None]
    tl.store(out_ptr + rows[:, None] * s_ot + heads[:, None] * s_oh + offs_d[None, :],
             out.to(out_ptr.dtype.element_ty), mask=md_mask)


def _interpreted(fn) -> bool:
    return not isinstance(fn, triton.runtime.jit.JITFunction)


# Triton picks compiled or interpreted code once per function, when its decorator runs: for
# these kernels when this module is imported, for Triton's own helpers (tl.cdiv, ...) when
# triton.language first is, often earlier (torch and transformers import it). TRITON_INTERPRET
# set between the two gives kernels that fail at launch with an obscure InterpreterError.
INTERPRETED: bool = _interpreted(_decode_kernel)
MIXED_MODES: bool = INTERPRETED != _interpreted(tl.cdiv)


def _pow2(n: int, floor: int = 1) -> int:
    return max(triton.next_power_of_2(n), floor)


def _dot_options(q: torch.Tensor) -> dict:
    return {
        # float32 inputs promise float32 results: no TF32 rounding inside tl.dot.
        "DOT_PRECISION": "ieee" if q.dtype == torch.float32 else "tf32",
        # Triton 3.9's interpreter computes bfloat16 dots on the raw bits; float32 is exact.
        "UPCAST": INTERPRETED and q.dtype == torch.bfloat16,
    }


def _cache_strides(k_cache: torch.Tensor, v_cache: torch.Tensor) -> tuple[int, ...]:
    # The kernels index head_dim with unit stride; the other three strides are free.
    return (*k_cache.stride()[:3], *v_cache.stride()[:3])


def paged_decode(out: torch.Tensor, q: torch.Tensor, k_cache: torch.Tensor,
                 v_cache: torch.Tensor, query_start_loc: torch.Tensor, seq_lens: torch.Tensor,
                 block_tables: torch.Tensor, scale: float, num_splits: int = 1,
                 tile_n: int = 32, num_warps: int = 4, num_stages: int = 3, window: int = 0,
                 softcap: float = 0.0) -> None:
    """Write ``out`` rows of the sequences with exactly one query row; others are left as is.

    ``num_splits`` (a power of two) splits each context over that many programs, for batches
    too small to fill the GPU on their own."""
    num_seqs = seq_lens.shape[0]
    num_heads, head_dim = q.shape[1], q.shape[2]
    num_kv_heads, block_d = k_cache.shape[2], _pow2(head_dim, 16)
    group = num_heads // num_kv_heads
    part_out = part_lse = out  # unused unless split
    if num_splits > 1:
        part_out = torch.empty((num_seqs, num_heads, num_splits, block_d), dtype=torch.float32,
                               device=q.device)
        part_lse = torch.empty((num_seqs, num_heads, num_splits), dtype=torch.float32,
                               device=q.device)
    _decode_kernel[(num_seqs, num_kv_heads, num_splits)](
        q, k_cache, v_cache, out, part_out, part_lse, query_start_loc, seq_lens, block_tables,
        scale, q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        *_cache_strides(k_cache, v_cache), block_tables.stride(0),
        GROUP=group, BLOCK_G=_pow2(group, 16), HEAD_DIM=head_dim, BLOCK_D=block_d,
        BLOCK_SIZE=k_cache.shape[1], TILE_N=tile_n, NUM_SPLITS=num_splits, **_dot_options(q),
        WINDOW=int(window), SOFTCAP=float(softcap), num_warps=num_warps, num_stages=num_stages,
    )
    if num_splits > 1:
        _decode_reduce[(num_seqs, num_heads)](
            out, part_out, part_lse, query_start_loc, out.stride(0), out.stride(1), num_heads,
            HEAD_DIM=head_dim, BLOCK_D=block_d, NUM_SPLITS=num_splits,
        )


def paged_prefill(out: torch.Tensor, q: torch.Tensor, k_cache: torch.Tensor,
                  v_cache: torch.Tensor, query_start_loc: torch.Tensor, seq_lens: torch.Tensor,
                  block_tables: torch.Tensor, scale: float, max_query_len: int,
                  block_m: int = 64, tile_n: int = 32, num_warps: int = 4,
                  num_stages: int = 3, window: int = 0, softcap: float = 0.0) -> None:
    """Write ``out`` rows of the sequences with two or more query rows; others are left as is."""
    num_seqs = seq_lens.shape[0]
    num_heads, head_dim = q.shape[1], q.shape[2]
    num_kv_heads = k_cache.shape[2]
    group = num_heads // num_kv_heads
    # tl.dot needs M >= 16; one program covers block_q tokens of all `group` heads.
    block_m = _pow2(max(block_m, group), 16)
    block_q = block_m // group
    grid = (num_seqs, triton.cdiv(max_query_len, block_q), num_kv_heads)
    _prefill_kernel[grid](
        q, k_cache, v_cache, out, query_start_loc, seq_lens, block_tables, scale,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        *_cache_strides(k_cache, v_cache), block_tables.stride(0),
        GROUP=group, BLOCK_Q=block_q, BLOCK_M=block_m, HEAD_DIM=head_dim,
        BLOCK_D=_pow2(head_dim, 16), BLOCK_SIZE=k_cache.shape[1], TILE_N=tile_n,
        **_dot_options(q), WINDOW=int(window), SOFTCAP=float(softcap), num_warps=num_warps,
        num_stages=num_stages,
    )
