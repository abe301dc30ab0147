"""Channel-wise INT8 (ALISE Eq. 8): error bound, per-channel scales, shapes and dtypes."""
from __future__ import annotations

import pytest
import torch

from services.kvmanager.int8 import QMAX, bytes_per_channel, dequantize, param_dtype, quantize

SHAPE = (3, 2, 5, 16, 4, 8)     # layers, K/V, blocks, block_size, kv heads, head_dim
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def kv_like(dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    """Channels with very different offsets and spreads, as keys have."""
    gen = torch.Generator().manual_seed(seed)
    spread = torch.rand(SHAPE[-2:], generator=gen) * 10
    offset = torch.randn(SHAPE[-2:], generator=gen) * 50
    return (torch.randn(SHAPE, generator=gen) * spread + offset).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_round_trip_shapes_and_dtypes(dtype):
    x = kv_like(dtype)
    q = quantize(x)
    assert q.codes.shape == x.shape and q.codes.dtype == torch.uint8
    params = SHAPE[:3] + SHAPE[4:]
    assert q.scale.shape == q.offset.shape == params
    assert q.scale.dtype == q.offset.dtype == param_dtype(dtype)
    y = dequantize(q, dtype)
    assert y.shape == x.shape and y.dtype == dtype


@pytest.mark.parametrize("dtype", DTYPES)
def test_error_is_at_most_half_a_step_per_element(dtype):
    x = kv_like(dtype, seed=1)
    q = quantize(x)
    scale = q.scale.float().unsqueeze(-3)
    err = (dequantize(q, torch.float32) - x.float()).abs()
    slack = 1e-4 * scale + 1e-6 * x.float().abs()      # fp32 arithmetic, nothing more
    assert (err <= scale / 2 + slack).all(), (err / scale).max()
    # Narrowing to a 16-bit result adds at most as much again: x itself is representable.
    err16 = (dequantize(q, dtype).float() - x.float()).abs()
    assert (err16 <= scale + slack).all()


@pytest.mark.parametrize("dtype", DTYPES)
def test_scale_is_each_channels_own_range(dtype):
    x = kv_like(dtype, seed=2)
    x[..., 0, 0] *= 1000                    # one loud channel must not coarsen the others
    xf = x.float()
    span = xf.amax(dim=-3) - xf.amin(dim=-3)
    q = quantize(x)
    # Rounding the offset down (at most one 16-bit step of |min|) and the scale up widen it.
    room = span + 2 ** -7 * xf.amin(dim=-3).abs()
    assert (q.scale.float() * QMAX <= room * (1 + 2 ** -7) + 1e-6).all()
    assert (q.scale.float() * QMAX >= span * (1 - 1e-6)).all()
    quiet = (dequantize(q, torch.float32) - xf)[..., 1:, :].abs().max()
    one_step_of_loud = span[..., 0, 0].min() / QMAX
    assert quiet < one_step_of_loud / 100, "a loud channel coarsened its neighbours"


def test_constant_and_offset_channels_are_exact_or_close():
    x = torch.full(SHAPE, 100.0)
    x[..., 1, :] = 100.01                   # far from 0: an integer zero point could not fit
    y = dequantize(quantize(x), torch.float32)
    assert torch.equal(y[..., 0, :], x[..., 0, :])
    assert (y - x).abs().max() < 1e-3


def test_codes_use_the_full_range():
    q = quantize(kv_like(torch.float32, seed=3))
    assert int(q.codes.min()) == 0 and int(q.codes.max()) == QMAX


def test_host_bytes_per_channel_count_the_scales():
    assert bytes_per_channel(16, torch.float16) == 16 + 2 + 2
    assert bytes_per_channel(16, torch.float32) == 16 + 2 + 2


def test_stale_slots_after_the_last_token_do_not_stretch_the_scales():
    x = kv_like(torch.float32, seed=4)
    num_blocks, block_size = SHAPE[2], SHAPE[3]
    num_tokens = (num_blocks - 1) * block_size + 3
    stale = x.clone()
    stale[..., -1, 3:, :, :] = 1e6                  # another request's KV, or garbage
    stale[..., -1, 5, 0, 0] = float("nan")
    q, clean = quantize(stale, num_tokens), quantize(x[..., :-1, :, :, :])
    assert torch.equal(q.scale[..., :-1, :, :], clean.scale)
    y = dequantize(q, torch.float32)
    valid = torch.arange(num_blocks * block_size).view(num_blocks, block_size, 1, 1) < num_tokens
    err = (y - x).abs().where(valid, 0.0)
    assert (err <= q.scale.float().unsqueeze(-3) * (0.5 + 1e-4) + 1e-5).all()
    assert not y.isnan().any() and y.abs().max() < 1e3
    assert torch.equal(quantize(x, num_blocks * block_size).codes, quantize(x).codes)


@pytest.mark.parametrize("num_tokens", [0, (SHAPE[2] - 1) * SHAPE[3], SHAPE[2] * SHAPE[3] + 1])
def test_a_token_count_that_does_not_fit_the_blocks_is_refused(num_tokens):
    with pytest.raises(ValueError, match="do not fill the last"):
        quantize(kv_like(torch.float32), num_tokens)
