"""Host storage of KV blocks: the bytes, not who owns them (see ``host_pool``).

Both stores keep the device's layout ``[num_layers, 2, num_blocks, block_size, Hkv, D]`` with
blocks on dim 2, so a run of consecutive host blocks is a strided view the executor can export
into and import from directly: the copy is then the only pass over the bytes.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from services.executor.types import ModelInfo
from services.kvmanager.int8 import (
    QuantizedBlocks,
    bytes_per_channel,
    dequantize,
    param_dtype,
    quantize,
)


@dataclass(frozen=True)
class BlockLayout:
    num_layers: int
    block_size: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype

    @classmethod
    def from_model_info(cls, info: ModelInfo) -> BlockLayout:
        dtype = getattr(torch, info.dtype, None)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"model dtype {info.dtype!r} is not a torch dtype")
        return cls(info.num_layers, info.block_size, info.num_kv_heads, info.head_dim, dtype)

    def shape(self, num_blocks: int) -> tuple[int, ...]:
        return (self.num_layers, 2, num_blocks, self.block_size, self.num_kv_heads, self.head_dim)

    @property
    def num_channels(self) -> int:
        """Channels of one block: (layer, K/V, kv head, head_dim element)."""
        return self.num_layers * 2 * self.num_kv_heads * self.head_dim

    @property
    def device_block_bytes(self) -> int:
        elem = torch.empty(0, dtype=self.dtype).element_size()
        return math.prod(self.shape(1)) * elem


def _ids(host_ids: list[int]) -> torch.Tensor:
    return torch.tensor(host_ids, dtype=torch.long)


def _empty(shape, dtype: torch.dtype, pin: bool) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, pin_memory=pin)


class FpHostStore:
    """Blocks kept bit-exact in the device dtype."""

    def __init__(self, layout: BlockLayout, num_blocks: int, pin: bool):
        self.layout = layout
        self.data = _empty(layout.shape(num_blocks), layout.dtype, pin)

    @staticmethod
    def block_bytes(layout: BlockLayout) -> int:
        return layout.device_block_bytes

    def run_view(self, host_ids: list[int]) -> torch.Tensor | None:
        """The blocks as a view of the store if they are consecutive and ascending."""
        first = host_ids[0]
        if host_ids != list(range(first, first + len(host_ids))):
            return None
        return self.data[:, :, first:first + len(host_ids)]

    def write(self, host_ids: list[int], blocks: torch.Tensor,
              num_tokens: int | None = None) -> None:
        self.data.index_copy_(2, _ids(host_ids), blocks)    # stale slots too: bit-exact

    def read(self, host_ids: list[int], out: torch.Tensor) -> torch.Tensor:
        return torch.index_select(self.data, 2, _ids(host_ids), out=out)


class Int8HostStore:
    """Blocks kept as uint8 codes plus a 16-bit scale and offset per channel (see ``int8``).

    Blocks are (de)quantized one piece at a time -- a few blocks of one layer's K or V, which
    is contiguous in both the staging buffer and the store -- so that every pass runs over
    memory in cache, and the temporaries are small enough for the allocator to reuse instead
    of mapping (and page-faulting) fresh memory each time, which costs more than the math."""

    PIECE_BYTES = 4 << 20

    def __init__(self, layout: BlockLayout, num_blocks: int, pin: bool):
        self.layout = layout
        params = (layout.num_layers, 2, num_blocks, layout.num_kv_heads, layout.head_dim)
        pdt = param_dtype(layout.dtype)
        self.codes = _empty(layout.shape(num_blocks), torch.uint8, pin)
        self.scale, self.offset = _empty(params, pdt, pin), _empty(params, pdt, pin)
        plane_block_bytes = math.prod(layout.shape(1)[3:]) * 4      # as fp32 while quantizing
        self.piece = max(1, self.PIECE_BYTES // plane_block_bytes)

    @staticmethod
    def block_bytes(layout: BlockLayout) -> int:
        return layout.num_channels * bytes_per_channel(layout.block_size, layout.dtype)

    def run_view(self, host_ids: list[int]) -> None:
        return None     # quantizing needs the blocks in the device dtype first: always staged

    def write(self, host_ids: list[int], blocks: torch.Tensor,
              num_tokens: int | None = None) -> None:
        for layer, kv, start, end in self._pieces(len(host_ids)):
            tokens = _tokens_in(num_tokens, start, end, self.layout.block_size)
            q = quantize(blocks[layer, kv, start:end], tokens)
            idx = _ids(host_ids[start:end])
            self.codes[layer, kv].index_copy_(0, idx, q.codes)
            self.scale[layer, kv].index_copy_(0, idx, q.scale)
            self.offset[layer, kv].index_copy_(0, idx, q.offset)

    def read(self, host_ids: list[int], out: torch.Tensor) -> torch.Tensor:
        for layer, kv, start, end in self._pieces(len(host_ids)):
            idx = _ids(host_ids[start:end])
            q = QuantizedBlocks(self.codes[layer, kv].index_select(0, idx),
                                self.scale[layer, kv].index_select(0, idx),
                                self.offset[layer, kv].index_select(0, idx))
            dequantize(q, self.layout.dtype, out=out[layer, kv, start:end])
        return out

    def _pieces(self, num_blocks: int):
        for layer in range(self.layout.num_layers):
            for kv in range(2):
                for start in range(0, num_blocks, self.piece):
                    yield layer, kv, start, min(start + self.piece, num_blocks)


def _tokens_in(num_tokens: int | None, start: int, end: int, block_size: int) -> int | None:
    """Tokens of KV in blocks ``start..end-1`` of a request holding ``num_tokens``."""
    if num_tokens is None:
        return None
    return min(num_tokens - start * block_size, (end - start) * block_size)
