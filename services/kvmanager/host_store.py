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
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise ValueError(f"model dtype {info.dtype!r} is not a torch floating-point dtype")
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

    def write(self, host_ids: list[int], blocks: torch.Tensor) -> None:
        self.data.index_copy_(2, _ids(host_ids), blocks)

    def read(self, host_ids: list[int], out: torch.Tensor) -> torch.Tensor:
        return torch.index_select(self.data, 2, _ids(host_ids), out=out)


class Int8HostStore:
    """Blocks kept as uint8 codes plus a 16-bit scale and offset per channel (see ``int8``)."""

    def __init__(self, layout: BlockLayout, num_blocks: int, pin: bool):
        self.layout = layout
        params = (layout.num_layers, 2, num_blocks, layout.num_kv_heads, layout.head_dim)
        pdt = param_dtype(layout.dtype)
        self.codes = _empty(layout.shape(num_blocks), torch.uint8, pin)
        self.scale, self.offset = _empty(params, pdt, pin), _empty(params, pdt, pin)

    @staticmethod
    def block_bytes(layout: BlockLayout) -> int:
        return layout.num_channels * bytes_per_channel(layout.block_size, layout.dtype)

    def run_view(self, host_ids: list[int]) -> None:
        return None     # quantizing needs the blocks in the device dtype first: always staged

    def write(self, host_ids: list[int], blocks: torch.Tensor) -> None:
        q, idx = quantize(blocks), _ids(host_ids)
        self.codes.index_copy_(2, idx, q.codes)
        self.scale.index_copy_(2, idx, q.scale)
        self.offset.index_copy_(2, idx, q.offset)

    def read(self, host_ids: list[int], out: torch.Tensor) -> torch.Tensor:
        idx = _ids(host_ids)
        q = QuantizedBlocks(self.codes.index_select(2, idx), self.scale.index_select(2, idx),
                            self.offset.index_select(2, idx))
        return out.copy_(dequantize(q, self.layout.dtype))
