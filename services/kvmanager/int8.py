"""Channel-wise INT8 for swapped-out KV blocks (ALISE Eq. 8).

Blocks arrive in host layout ``[..., block_size, num_kv_heads, head_dim]``: every channel
(one kv head x head_dim element of one layer, K or V, in one block) gets its own scale and
offset over the block's tokens, so a channel with large values does not cost precision to
the small ones next to it (keys have strong per-channel outliers).

Eq. 8 writes ``x_q = round(x / scale + z)``, ``x = scale * (x_q - z)`` with an integer zero
point ``z``. A channel whose values are all far from 0 (min = 100, max = 100.01) needs a ``z``
of millions, which no small integer holds, so the zero point is kept as a float offset
``m = -scale * z`` instead: ``x_q = round((x - m) / scale)``, ``x = scale * x_q + m``.

Scale and offset are stored in 16 bits (4 bytes per channel and block). The offset is rounded
*down* and the scale *up* to that precision, so every value still maps into 0..255 and the
error of one element stays within ``scale / 2`` of the stored scale.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

QMAX = 255
TOKEN_DIM = -3          # [..., block_size, num_kv_heads, head_dim]


class QuantizedBlocks(NamedTuple):
    codes: torch.Tensor     # uint8, the input's shape
    scale: torch.Tensor     # param_dtype, the input's shape without the token dim
    offset: torch.Tensor    # param_dtype, same shape as scale


def param_dtype(dtype: torch.dtype) -> torch.dtype:
    """fp16 data keeps fp16 parameters (its min is exact, the scale finer); bf16 and fp32
    data take bf16, the only 16-bit type with fp32's range."""
    return torch.float16 if dtype == torch.float16 else torch.bfloat16


def quantize(x: torch.Tensor, num_tokens: int | None = None) -> QuantizedBlocks:
    """``x[..., num_blocks, block_size, Hkv, D]``. With ``num_tokens``, the slots after the
    first ``num_tokens`` (the stale tail of the last block) neither shape the scales nor keep
    their values: they come back as the channel's offset."""
    pdt = param_dtype(x.dtype)
    xf = x.float()
    valid = _valid_slots(x, num_tokens)
    low, high = _channel_range(xf, valid)
    offset = _round_toward(low, pdt, -torch.inf)
    scale = _round_toward((high - offset.float()) / QMAX, pdt, torch.inf)
    # A constant channel whose offset is exact has span 0: any positive scale codes it as 0.
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    inv = scale.float().reciprocal().unsqueeze(TOKEN_DIM)
    # (x - offset) / scale + 0.5, which the uint8 cast truncates, i.e. rounds; written into
    # one buffer in place (addcmul's broadcasting kernel is several times slower on a CPU).
    bias = 0.5 - offset.float().unsqueeze(TOKEN_DIM) * inv
    codes = torch.mul(xf, inv, out=torch.empty_like(xf)).add_(bias).clamp_(0, QMAX)
    if valid is not None:
        codes.masked_fill_(~valid, 0)
    return QuantizedBlocks(codes.to(torch.uint8), scale, offset)


def dequantize(q: QuantizedBlocks, dtype: torch.dtype,
               out: torch.Tensor | None = None) -> torch.Tensor:
    """Into ``out`` when given (e.g. a staging buffer), else a new tensor of ``dtype``."""
    offset = q.offset.float().unsqueeze(TOKEN_DIM)
    scale = q.scale.float().unsqueeze(TOKEN_DIM)
    if out is None:
        out = torch.empty(q.codes.shape, dtype=dtype, device=q.codes.device)
    return torch.addcmul(offset, q.codes, scale, out=out)


def bytes_per_channel(block_size: int, dtype: torch.dtype) -> int:
    """Host bytes of one channel of one block: a code per token plus scale and offset."""
    return block_size + 2 * torch.empty(0, dtype=param_dtype(dtype)).element_size()


def _channel_range(xf: torch.Tensor, valid: torch.Tensor | None):
    if valid is None:       # two reductions: aminmax over a middle dim is far slower
        return xf.amin(dim=TOKEN_DIM), xf.amax(dim=TOKEN_DIM)
    return (xf.where(valid, torch.inf).amin(dim=TOKEN_DIM),
            xf.where(valid, -torch.inf).amax(dim=TOKEN_DIM))


def _valid_slots(x: torch.Tensor, num_tokens: int | None) -> torch.Tensor | None:
    """Mask ``[num_blocks, block_size, 1, 1]`` of the slots holding KV; None if all do."""
    num_blocks, block_size = x.shape[-4], x.shape[-3]
    if num_tokens is None or num_tokens == num_blocks * block_size:
        return None
    if not (num_blocks - 1) * block_size < num_tokens <= num_blocks * block_size:
        raise ValueError(f"{num_tokens} tokens do not fill the last of {num_blocks} blocks of "
                         f"{block_size} slots")
    slots = torch.arange(num_blocks * block_size, device=x.device) < num_tokens
    return slots.view(num_blocks, block_size, 1, 1)


def _round_toward(t: torch.Tensor, dtype: torch.dtype, direction: float) -> torch.Tensor:
    """``t`` (fp32) in ``dtype``, rounded toward ``direction`` where nearest is on the wrong
    side, so the bound the caller relies on survives the narrowing."""
    y = t.to(dtype)
    wrong = y.float() > t if direction < 0 else y.float() < t
    return torch.where(wrong, torch.nextafter(y, torch.full_like(y, direction)), y)
