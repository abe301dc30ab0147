"""Channel-wise INT8 (ALISE Eq. 8) in groups of blocks: error bound, per-channel scales,
the packed form's bytes, shapes and dtypes."""
from __future__ import annotations

import pytest
import torch

from services.executor.kv_cache import KVCachePool
from services.kvmanager.int8 import (
    GROUP_BLOCKS,
    QMAX,
    block_bytes,
    dequantize,
    element_scale,
    packed_nbytes,
    param_dtype,
    quantize,
)

# layers, K/V, blocks (two full groups and a partial one), block_size, kv heads, head_dim
SHAPE = (3, 2, 2 * GROUP_BLOCKS + 3, 16, 4, 8)
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def kv_like(dtype: torch.dtype, seed: int = 0, shape=SHAPE) -> torch.Tensor:
    """Channels with very different offsets and spreads, as keys have."""
    gen = torch.Generator().manual_seed(seed)
    spread = torch.rand(shape[-2:], generator=gen) * 10
    offset = torch.randn(shape[-2:], generator=gen) * 50
    return (torch.randn(shape, generator=gen) * spread + offset).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_round_trip_shapes_and_dtypes(dtype):
    x = kv_like(dtype)
    q = quantize(x)
    assert q.codes.shape == x.shape and q.codes.dtype == torch.uint8
    per_block = SHAPE[4] * SHAPE[5] // GROUP_BLOCKS
    assert q.scale.shape == q.offset.shape == SHAPE[:3] + (per_block,)
    assert q.scale.dtype == q.offset.dtype == param_dtype(dtype)
    y = dequantize(q, dtype)
    assert y.shape == x.shape and y.dtype == dtype


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_blocks", [1, 3, GROUP_BLOCKS, SHAPE[2]])
def test_error_is_at_most_half_a_step_per_element(dtype, num_blocks):
    x = kv_like(dtype, seed=1)[:, :, :num_blocks]
    q = quantize(x)
    step = element_scale(q)
    err = (dequantize(q, torch.float32) - x.float()).abs()
    slack = 1e-4 * step + 1e-6 * x.float().abs()      # fp32 arithmetic, nothing more
    assert (err <= step / 2 + slack).all(), (err / step).max()
    # Narrowing to a 16-bit result adds at most as much again: x itself is representable.
    err16 = (dequantize(q, dtype).float() - x.float()).abs()
    assert (err16 <= step + slack).all()


@pytest.mark.parametrize("dtype", DTYPES)
def test_in_a_full_group_each_channel_has_its_own_range(dtype):
    x = kv_like(dtype, seed=2, shape=(3, 2, GROUP_BLOCKS, 16, 4, 8))
    x[..., 0, 0] *= 1000                    # one loud channel must not coarsen the others
    xf = x.float()
    q = quantize(x)
    over_group = (-4, -3)                    # the group's blocks and tokens of each channel
    span = xf.amax(dim=over_group) - xf.amin(dim=over_group)
    step = element_scale(q)[..., 0, 0, :, :]            # one group: the same for every token
    room = span + 2 ** -7 * xf.amin(dim=over_group).abs()
    assert (step * QMAX <= room * (1 + 2 ** -7) + 1e-6).all()
    assert (step * QMAX >= span * (1 - 1e-6)).all()
    quiet = (dequantize(q, torch.float32) - xf)[..., 1:, :].abs().max()
    one_step_of_loud = span[..., 0, 0].min() / QMAX
    assert quiet < one_step_of_loud / 100, "a loud channel coarsened its neighbours"


def test_a_partial_group_shares_a_scale_only_among_adjacent_channels():
    x = kv_like(torch.float32, seed=5, shape=(1, 2, 3, 16, 4, 8))     # 3 of 8 blocks
    x[..., 0, 0] *= 1000
    err = (dequantize(quantize(x), torch.float32) - x).abs()
    loud = x[..., 0, 0].abs().max()
    # Tail share for 3 blocks is 4 channels: head 0's channels 0-3 are coarse, the rest not.
    assert err[..., 0, 4:].max() < loud / QMAX / 50 and err[..., 1:, :].max() < loud / QMAX / 50


def test_constant_and_offset_channels_are_exact_or_close():
    x = torch.full(SHAPE, 100.0)
    x[..., 1, :] = 100.01                   # far from 0: an integer zero point could not fit
    y = dequantize(quantize(x), torch.float32)
    assert torch.equal(y[..., 0, :], x[..., 0, :])
    assert (y - x).abs().max() < 1e-3


def test_codes_use_the_full_range():
    q = quantize(kv_like(torch.float32, seed=3))
    assert int(q.codes.min()) == 0 and int(q.codes.max()) == QMAX


@pytest.mark.parametrize("dtype, least", [(torch.bfloat16, 1.9), (torch.float16, 1.9),
                                          (torch.float32, 3.8)])
def test_host_and_link_bytes_fall_by_the_goal_against_the_device_dtype(dtype, least):
    layers, bs, heads, dim = 32, 16, 32, 128
    device = KVCachePool.bytes_per_block(layers, bs, heads, dim, dtype)
    host = packed_nbytes(layers, 1, bs, heads * dim)
    assert host == layers * 2 * block_bytes(bs, heads * dim)
    assert device / host >= least, device / host


def test_stale_slots_after_the_last_token_do_not_stretch_the_scales():
    x = kv_like(torch.float32, seed=4)
    num_blocks, block_size = SHAPE[2], SHAPE[3]
    num_tokens = (num_blocks - 1) * block_size + 3
    stale = x.clone()
    stale[..., -1, 3:, :, :] = 1e6                  # another request's KV, or garbage
    stale[..., -1, 5, 0, 0] = float("nan")
    q = quantize(stale, num_tokens)
    y = dequantize(q, torch.float32)
    valid = torch.arange(num_blocks * block_size).view(num_blocks, block_size, 1, 1) < num_tokens
    err = (y - x).abs().where(valid, 0.0)
    assert (err <= element_scale(q) * (0.5 + 1e-4) + 1e-5).all()
    assert not y.isnan().any() and y.abs().max() < 1e3
    assert torch.equal(quantize(x, num_blocks * block_size).codes, quantize(x).codes)


@pytest.mark.parametrize("num_tokens", [0, (SHAPE[2] - 1) * SHAPE[3], SHAPE[2] * SHAPE[3] + 1])
def test_a_token_count_that_does_not_fit_the_blocks_is_refused(num_tokens):
    with pytest.raises(ValueError, match="do not fill the last"):
        quantize(kv_like(torch.float32), num_tokens)


def test_the_pool_quantizes_before_the_copy_and_the_bytes_are_the_packed_form():
    pool = KVCachePool(2, 24, 16, 2, 8, torch.bfloat16)
    pool.cache.copy_(torch.randn(pool.cache.shape) * 3)
    ids, tokens = [5, 1, 7, 3, 9, 11, 13, 15, 17, 2], 9 * 16 + 4
    packed = pool.export_blocks_int8(ids, tokens)
    assert packed.dtype == torch.uint8 and packed.numel() == pool.packed_nbytes(len(ids))
    assert pool.block_bytes * len(ids) / packed.numel() >= 1.9
    original = pool.cache[:, :, ids].float().clone()
    pool.cache[:, :, ids] = float("nan")
    pool.import_blocks_int8(ids, packed)
    q = quantize(original.to(torch.bfloat16), tokens)
    valid = (torch.arange(len(ids) * 16) < tokens).view(len(ids), 16, 1, 1)
    err = (pool.cache[:, :, ids].float() - original).abs().where(valid, 0.0)
    assert (err <= element_scale(q) * 1.01).all() and not pool.cache[:, :, ids].isnan().any()


@pytest.mark.parametrize("chunk_layers", [1, 2])
def test_layers_coded_in_chunks_give_the_bytes_of_one_pass(monkeypatch, chunk_layers):
    """The pool codes several layers per pass (fewer launches on a GPU); a chunk boundary
    anywhere must leave the packed bytes and the blocks that come back unchanged."""
    from services.executor import kv_cache
    pool = KVCachePool(3, 24, 16, 2, 8, torch.bfloat16)
    pool.cache.copy_(torch.randn(pool.cache.shape) * 3)
    ids, tokens = [5, 1, 7, 3, 9, 11, 13, 15, 17, 2], 9 * 16 + 4
    whole = pool.export_blocks_int8(ids, tokens)
    per_layer = 2 * len(ids) * 16 * 2 * 8
    monkeypatch.setattr(kv_cache, "CODEC_CHUNK_ELEMENTS", chunk_layers * per_layer)
    assert list(pool._layer_chunks(len(ids)))[0] == (0, chunk_layers)
    chunked = pool.export_blocks_int8(ids, tokens)
    assert torch.equal(whole, chunked)
    pool.import_blocks_int8(ids, chunked)
    back_chunked = pool.cache[:, :, ids].clone()
    monkeypatch.setattr(kv_cache, "CODEC_CHUNK_ELEMENTS", 1 << 30)
    pool.import_blocks_int8(ids, whole)
    assert torch.equal(pool.cache[:, :, ids], back_chunked)
