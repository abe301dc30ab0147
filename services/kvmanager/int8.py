"""Channel-wise INT8 for swapped-out KV (ALISE Eq. 8), and its packed form on the host link.

Blocks are ``[..., num_blocks, block_size, num_kv_heads, head_dim]``; a channel is one kv
head x head_dim element (of one layer, K or V). Each channel gets its own scale and offset
over a *group* of ``GROUP_BLOCKS`` consecutive blocks of one request (128 tokens with blocks of
16), so a channel with large values does not cost precision to the small ones next to it
(keys have strong per-channel outliers), and the 16-bit scale and offset cost 4 bytes per 128
codes instead of per 16: host and link bytes fall 1.94x against bf16 and 3.88x against fp32
(1.6x and 3.2x with a scale per block).

A group's parameters are stored spread over its blocks, ``channels / GROUP_BLOCKS`` of them
per block, so each block still has a fixed size and host blocks stay interchangeable. A
request's last, partial group of ``m`` blocks has only ``m / GROUP_BLOCKS`` of that room: its
``s`` adjacent channels of a head (``s`` the power of two >= ``GROUP_BLOCKS / m``) share a
scale there. Only that tail is coarser than channel-wise.

Eq. 8 writes ``x_q = round(x / scale + z)``, ``x = scale * (x_q - z)`` with an integer zero
point ``z``. A channel whose values are all far from 0 (min = 100, max = 100.01) needs a ``z``
of millions, which no small integer holds, so the zero point is kept as a float offset
``m = -scale * z`` instead: ``x_q = round((x - m) / scale)``, ``x = scale * x_q + m``.
The offset is rounded *down* and the scale *up* to 16 bits, so every value still maps into
0..255 and the error of one element stays within ``scale / 2`` of its group's stored scale.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import torch

QMAX = 255
GROUP_BLOCKS = 8


class QuantizedBlocks(NamedTuple):
    codes: torch.Tensor     # uint8, the input's shape
    scale: torch.Tensor     # param_dtype, [..., num_blocks, channels // GROUP_BLOCKS]
    offset: torch.Tensor    # param_dtype, same shape as scale


def param_dtype(dtype: torch.dtype) -> torch.dtype:
    """fp16 data keeps fp16 parameters (its min is exact, the scale finer); bf16 and fp32
    data take bf16, the only 16-bit type with fp32's range."""
    return torch.float16 if dtype == torch.float16 else torch.bfloat16


def params_per_block(num_channels: int) -> int:
    if num_channels % GROUP_BLOCKS:
        raise ValueError(f"INT8 KV needs kv heads x head_dim divisible by {GROUP_BLOCKS}, "
                         f"got {num_channels}")
    return num_channels // GROUP_BLOCKS


def block_bytes(block_size: int, num_channels: int) -> int:
    """Host (and link) bytes of one block of one layer's K or V: codes plus its share of the
    group's scales and offsets."""
    return block_size * num_channels + 2 * 2 * params_per_block(num_channels)


def tail_share(num_blocks: int) -> int:
    """Channels sharing a scale in a partial group of ``num_blocks`` blocks."""
    return 1 << math.ceil(math.log2(GROUP_BLOCKS / num_blocks)) if num_blocks else 1


def quantize(x: torch.Tensor, num_tokens: int | None = None) -> QuantizedBlocks:
    """``x[..., num_blocks, block_size, Hkv, D]`` of one request, its blocks in order. With
    ``num_tokens``, the slots after the first ``num_tokens`` (the stale tail of the last
    block) neither shape the scales nor keep their values: they come back as the offset."""
    *lead, n, bs, heads, dim = x.shape
    c, pdt = heads * dim, param_dtype(x.dtype)
    per_block = params_per_block(c)
    xf = x.float().reshape(*lead, n * bs, c)
    valid = _valid_slots(n, bs, num_tokens, x.device)
    full = n // GROUP_BLOCKS * GROUP_BLOCKS
    codes = torch.empty(xf.shape, dtype=torch.uint8, device=x.device)
    scales, offsets = [], []
    if full:
        groups = xf[..., :full * bs, :].reshape(*lead, full // GROUP_BLOCKS,
                                                 GROUP_BLOCKS * bs, c)
        gvalid = None if valid is None else valid[:full * bs].view(-1, GROUP_BLOCKS * bs, 1)
        low, high = _range(groups, gvalid, (-2,))
        scale, offset = _params(low, high, pdt)
        codes[..., :full * bs, :] = _codes(groups, scale.unsqueeze(-2), offset.unsqueeze(-2),
                                           gvalid).reshape(*lead, full * bs, c)
        scales.append(scale.reshape(*lead, full, per_block))
        offsets.append(offset.reshape(*lead, full, per_block))
    if n > full:
        m, s = n - full, tail_share(n - full)
        tail = xf[..., full * bs:, :].reshape(*lead, m * bs, c // s, s)
        tvalid = None if valid is None else valid[full * bs:].view(-1, 1, 1)
        low, high = _range(tail, tvalid, (-3, -1))
        scale, offset = _params(low, high, pdt)
        wide = (scale.repeat_interleave(s, -1).unsqueeze(-2),
                offset.repeat_interleave(s, -1).unsqueeze(-2))
        tvalid = None if tvalid is None else tvalid.view(-1, 1)
        codes[..., full * bs:, :] = _codes(tail.reshape(*lead, m * bs, c), *wide, tvalid)
        scales.append(_pad(scale, m * per_block).reshape(*lead, m, per_block))
        offsets.append(_pad(offset, m * per_block).reshape(*lead, m, per_block))
    return QuantizedBlocks(codes.view(x.shape), torch.cat(scales, -2), torch.cat(offsets, -2))


def dequantize(q: QuantizedBlocks, dtype: torch.dtype,
               out: torch.Tensor | None = None) -> torch.Tensor:
    """Into ``out`` when given (e.g. a staging buffer or the device's blocks), else a new
    tensor of ``dtype``."""
    *lead, n, bs, heads, dim = q.codes.shape
    c = heads * dim
    scale, offset = _expand(q.scale, n, bs, c), _expand(q.offset, n, bs, c)
    codes = q.codes.reshape(*lead, n * bs, c)
    if out is None:
        out = torch.empty(q.codes.shape, dtype=dtype, device=q.codes.device)
    out.view(*lead, n * bs, c).copy_(torch.addcmul(offset, codes, scale))
    return out


def element_scale(q: QuantizedBlocks) -> torch.Tensor:
    """The quantization step of every element (its group's scale), shaped like the codes."""
    *lead, n, bs, heads, dim = q.codes.shape
    return _expand(q.scale, n, bs, heads * dim).view(q.codes.shape)


def _expand(params: torch.Tensor, n: int, bs: int, c: int) -> torch.Tensor:
    """Per-block parameter slots back to one (scale or offset) per token and channel."""
    *lead, _, per_block = params.shape
    full = n // GROUP_BLOCKS * GROUP_BLOCKS
    parts = []
    if full:
        groups = params[..., :full, :].float().reshape(*lead, full // GROUP_BLOCKS, 1, c)
        parts.append(groups.expand(*lead, full // GROUP_BLOCKS, GROUP_BLOCKS * bs, c)
                     .reshape(*lead, full * bs, c))
    if n > full:
        m, s = n - full, tail_share(n - full)
        tail = params[..., full:, :].float().reshape(*lead, m * per_block)[..., :c // s]
        parts.append(tail.repeat_interleave(s, -1).unsqueeze(-2).expand(*lead, m * bs, c))
    return torch.cat(parts, -2)


def _range(x: torch.Tensor, valid: torch.Tensor | None, dims: tuple[int, ...]):
    if valid is None:
        return x.amin(dim=dims), x.amax(dim=dims)
    return x.where(valid, torch.inf).amin(dim=dims), x.where(valid, -torch.inf).amax(dim=dims)


def _params(low: torch.Tensor, high: torch.Tensor, pdt: torch.dtype):
    # A group with no valid slot (cannot happen for a request's blocks) would be +-inf.
    low = torch.where(torch.isfinite(low), low, torch.zeros_like(low))
    high = torch.where(torch.isfinite(high), high, low)
    offset = _round_toward(low, pdt, -torch.inf)
    scale = _round_toward((high - offset.float()) / QMAX, pdt, torch.inf)
    # A constant channel whose offset is exact has span 0: any positive scale codes it as 0.
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    return scale, offset


def _codes(x: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor,
           valid: torch.Tensor | None) -> torch.Tensor:
    # (x - offset) / scale + 0.5, which the uint8 cast truncates, i.e. rounds.
    inv = scale.float().reciprocal()
    codes = torch.mul(x, inv).add_(0.5 - offset.float() * inv).clamp_(0, QMAX)
    if valid is not None:
        codes.masked_fill_(~valid, 0)
    return codes.to(torch.uint8)


def _pad(t: torch.Tensor, size: int) -> torch.Tensor:
    return torch.nn.functional.pad(t, (0, size - t.shape[-1]), value=1.0)


def _valid_slots(num_blocks: int, block_size: int, num_tokens: int | None,
                 device) -> torch.Tensor | None:
    """Mask ``[num_blocks * block_size, 1]`` of the slots holding KV; None if all do."""
    if num_tokens is None or num_tokens == num_blocks * block_size:
        return None
    if not (num_blocks - 1) * block_size < num_tokens <= num_blocks * block_size:
        raise ValueError(f"{num_tokens} tokens do not fill the last of {num_blocks} blocks of "
                         f"{block_size} slots")
    return (torch.arange(num_blocks * block_size, device=device) < num_tokens).view(-1, 1)


def _round_toward(t: torch.Tensor, dtype: torch.dtype, direction: float) -> torch.Tensor:
    """``t`` (fp32) in ``dtype``, rounded toward ``direction`` where nearest is on the wrong
    side, so the bound the caller relies on survives the narrowing."""
    y = t.to(dtype)
    wrong = y.float() > t if direction < 0 else y.float() < t
    return torch.where(wrong, torch.nextafter(y, torch.full_like(y, direction)), y)


# -- the packed form: what crosses the host link and what the host pool keeps ---------------

def packed_nbytes(num_layers: int, num_blocks: int, block_size: int, num_channels: int) -> int:
    """Bytes of ``num_blocks`` blocks of every layer, K and V, packed as INT8."""
    return num_layers * 2 * num_blocks * block_bytes(block_size, num_channels)


def packed_views(buf: torch.Tensor, num_layers: int, num_blocks: int, block_size: int,
                 num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> QuantizedBlocks:
    """Views of a flat uint8 buffer as ``[codes | scales | offsets]``: codes
    ``[num_layers, 2, num_blocks, block_size, Hkv, D]``, parameters
    ``[num_layers, 2, num_blocks, channels // GROUP_BLOCKS]`` in ``param_dtype(dtype)``."""
    c = num_kv_heads * head_dim
    shape = (num_layers, 2, num_blocks)
    ncodes = math.prod(shape) * block_size * c
    nparams = math.prod(shape) * params_per_block(c) * 2
    if buf.dtype != torch.uint8 or buf.dim() != 1 or buf.numel() < ncodes + 2 * nparams:
        raise ValueError(f"a packed INT8 buffer of {num_blocks} blocks needs "
                         f"{ncodes + 2 * nparams} uint8 bytes, got {tuple(buf.shape)} {buf.dtype}")
    pdt = param_dtype(dtype)
    codes = buf[:ncodes].view(*shape, block_size, num_kv_heads, head_dim)
    scale = buf[ncodes:ncodes + nparams].view(pdt).view(*shape, -1)
    offset = buf[ncodes + nparams:ncodes + 2 * nparams].view(pdt).view(*shape, -1)
    return QuantizedBlocks(codes, scale, offset)
