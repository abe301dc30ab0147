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


def quantize(x: torch.Tensor) -> QuantizedBlocks:
    pdt = param_dtype(x.dtype)
    xf = x.float()
    offset = _round_toward(xf.amin(dim=TOKEN_DIM), pdt, -torch.inf)
    span = xf.amax(dim=TOKEN_DIM) - offset.float()
    scale = _round_toward(span / QMAX, pdt, torch.inf)
    # A constant channel whose offset is exact has span 0: any positive scale codes it as 0.
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    codes = (xf - offset.float().unsqueeze(TOKEN_DIM)).div_(scale.float().unsqueeze(TOKEN_DIM))
    return QuantizedBlocks(codes.round_().clamp_(0, QMAX).to(torch.uint8), scale, offset)


def dequantize(q: QuantizedBlocks, dtype: torch.dtype) -> torch.Tensor:
    offset = q.offset.float().unsqueeze(TOKEN_DIM)
    return torch.addcmul(offset, q.codes.float(), q.scale.float().unsqueeze(TOKEN_DIM)).to(dtype)


def bytes_per_channel(block_size: int, dtype: torch.dtype) -> int:
    """Host bytes of one channel of one block: a code per token plus scale and offset."""
    return block_size + 2 * torch.empty(0, dtype=param_dtype(dtype)).element_size()


def _round_toward(t: torch.Tensor, dtype: torch.dtype, direction: float) -> torch.Tensor:
    """``t`` (fp32) in ``dtype``, rounded toward ``direction`` where nearest is on the wrong
    side, so the bound the caller relies on survives the narrowing."""
    y = t.to(dtype)
    wrong = y.float() > t if direction < 0 else y.float() < t
    return torch.where(wrong, torch.nextafter(y, torch.full_like(y, direction)), y)
