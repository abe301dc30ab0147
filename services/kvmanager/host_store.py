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
from services.kvmanager.int8 import QuantizedBlocks, packed_views, param_dtype, params_per_block
from services.kvmanager.int8 import block_bytes as int8_block_bytes


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
    """Blocks kept as uint8 codes plus each block's share of its group's 16-bit scales and
    offsets (see ``int8``). The executor quantizes before the copy out and dequantizes after
    the copy in, so this store only moves the packed bytes: no arithmetic on the host."""

    def __init__(self, layout: BlockLayout, num_blocks: int, pin: bool):
        self.layout = layout
        per_block = params_per_block(layout.num_kv_heads * layout.head_dim)
        params = (layout.num_layers, 2, num_blocks, per_block)
        pdt = param_dtype(layout.dtype)
        self.codes = _empty(layout.shape(num_blocks), torch.uint8, pin)
        self.scale, self.offset = _empty(params, pdt, pin), _empty(params, pdt, pin)

    @staticmethod
    def block_bytes(layout: BlockLayout) -> int:
        return layout.num_layers * 2 * int8_block_bytes(layout.block_size,
                                                       layout.num_kv_heads * layout.head_dim)

    def packed_nbytes(self, num_blocks: int) -> int:
        return num_blocks * self.block_bytes(self.layout)

    def packed(self, buf: torch.Tensor, num_blocks: int) -> QuantizedBlocks:
        lay = self.layout
        return packed_views(buf, lay.num_layers, num_blocks, lay.block_size, lay.num_kv_heads,
                            lay.head_dim, lay.dtype)

    def write_packed(self, host_ids: list[int], buf: torch.Tensor) -> None:
        idx = _ids(host_ids)
        for store, part in zip((self.codes, self.scale, self.offset),
                               self.packed(buf, len(host_ids))):
            store.index_copy_(2, idx, part)

    def read_packed(self, host_ids: list[int], out: torch.Tensor) -> torch.Tensor:
        idx = _ids(host_ids)
        for store, part in zip((self.codes, self.scale, self.offset),
                               self.packed(out, len(host_ids))):
            torch.index_select(store, 2, idx, out=part)
        return out
