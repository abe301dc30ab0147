"""The device KV pool: fixed-size blocks shared by all layers, addressed by block tables.

All layers live in one tensor ``[num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim]``
so that exporting a request's blocks is one gather whose result already has the host layout
``[num_layers, 2, n, block_size, num_kv_heads, head_dim]`` (see ``Executor.export_blocks``).
Which block belongs to whom is the scheduler's business; ``BlockAllocator`` is the minimal
bookkeeping for callers that drive the executor directly (tests, benchmarks).
"""
from __future__ import annotations

import torch

from lenserve_contract.sampling_params import InvalidRequestError
from services.kvmanager import int8

# The most KV elements (all layers of a chunk, K and V) the INT8 codec takes in one pass: its
# fp32 temporaries are a few times this in bytes (a few hundred MB at most).
CODEC_CHUNK_ELEMENTS = 1 << 24


class KVCachePool:
    def __init__(self, num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int,
                 head_dim: int, dtype: torch.dtype = torch.float32, device: str = "cpu",
                 scratch: bool = False):
        """``scratch``: one more block past ``num_blocks`` that belongs to nobody, where the
        padding rows of a CUDA-graph batch write their KV (never handed out, never exported)."""
        if num_blocks < 1 or block_size < 1:
            raise InvalidRequestError(
                f"KV pool needs num_blocks >= 1 and block_size >= 1, got {num_blocks} and "
                f"{block_size}", field="num_gpu_blocks")
        self.num_layers, self.num_blocks, self.block_size = num_layers, num_blocks, block_size
        self.num_kv_heads, self.head_dim = num_kv_heads, head_dim
        self.scratch_block = num_blocks if scratch else None
        # Layers the INT8 codec takes per pass; None: as many as CODEC_CHUNK_ELEMENTS allows
        # (``lenserve bench-swap --codec-layers`` sets it to compare).
        self.codec_layers: int | None = None
        physical = num_blocks + int(scratch)
        self.cache = torch.zeros((num_layers, 2, physical, block_size, num_kv_heads, head_dim),
                                 dtype=dtype, device=device)

    @staticmethod
    def bytes_per_block(num_layers: int, block_size: int, num_kv_heads: int, head_dim: int,
                        dtype: torch.dtype) -> int:
        elem = torch.empty(0, dtype=dtype).element_size()
        return num_layers * 2 * block_size * num_kv_heads * head_dim * elem

    @property
    def block_bytes(self) -> int:
        return self.bytes_per_block(self.num_layers, self.block_size, self.num_kv_heads,
                                    self.head_dim, self.cache.dtype)

    def layer(self, idx: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(k_cache, v_cache)`` of one layer, each ``[num_blocks, block_size, Hkv, D]``."""
        return self.cache[idx, 0], self.cache[idx, 1]

    def write(self, idx: int, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor) -> None:
        """Store ``k, v[num_tokens, Hkv, D]`` at flat slots ``block * block_size + offset``."""
        k_cache, v_cache = self.layer(idx)
        k_cache.view(-1, self.num_kv_heads, self.head_dim)[slot_mapping] = k.to(k_cache.dtype)
        v_cache.view(-1, self.num_kv_heads, self.head_dim)[slot_mapping] = v.to(v_cache.dtype)

    def check_block_ids(self, block_ids: list[int], field: str = "block_ids") -> None:
        bad = [b for b in block_ids if not 0 <= b < self.num_blocks]
        if bad:
            raise InvalidRequestError(
                f"unknown KV block id(s) {bad[:8]}: the pool has blocks 0..{self.num_blocks - 1}",
                field=field)

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        """Device-to-device ``(src, dst)`` copies; all sources are read before any write so that
        chains like ``[(0, 1), (1, 2)]`` copy the original contents."""
        if not pairs:
            return
        self.check_block_ids([b for pair in pairs for b in pair], field="copy_blocks")
        src = torch.tensor([s for s, _ in pairs], device=self.cache.device)
        dst = torch.tensor([d for _, d in pairs], device=self.cache.device)
        self.cache[:, :, dst] = self.cache[:, :, src].clone()

    def export_blocks(self, block_ids: list[int], out: torch.Tensor | None = None) -> torch.Tensor:
        """Gather blocks into host layout; into ``out`` when given (a caller's staging buffer
        or a strided view of its own pool) so that the export is the only copy."""
        self.check_block_ids(block_ids)
        idx = torch.tensor(block_ids, dtype=torch.long, device=self.cache.device)
        if out is None:
            return self.cache[:, :, idx].to("cpu").contiguous()
        self._check_export_out(out, len(block_ids))
        if out.device == self.cache.device:
            torch.index_select(self.cache, 2, idx, out=out)
        else:
            _copy_by_slices(out, self.cache.index_select(2, idx))
        return out

    def _check_export_out(self, out: torch.Tensor, n: int) -> None:
        want = (self.num_layers, 2, n, self.block_size, self.num_kv_heads, self.head_dim)
        if tuple(out.shape) != want or out.dtype != self.cache.dtype or out.device.type != "cpu":
            raise InvalidRequestError(
                f"export buffer is {tuple(out.shape)} {out.dtype} on {out.device}, expected "
                f"{want} {self.cache.dtype} on the host", field="out")

    def import_blocks(self, block_ids: list[int], data: torch.Tensor) -> None:
        self.check_block_ids(block_ids)
        want = (self.num_layers, 2, len(block_ids), self.block_size, self.num_kv_heads,
                self.head_dim)
        if tuple(data.shape) != want:
            raise InvalidRequestError(
                f"imported KV data has shape {tuple(data.shape)}, expected {want}", field="data")
        if data.device != self.cache.device:
            staged = torch.empty(want, dtype=data.dtype, device=self.cache.device)
            data = _copy_by_slices(staged, data)
        data = data.to(dtype=self.cache.dtype)
        # Runs of consecutive blocks as slice copies: an indexed write (index_put) runs at
        # about half of memcpy speed for 2-byte dtypes on CPUs, and swapped blocks are mostly
        # allocated in runs.
        for start, src, length in _runs(block_ids):
            self.cache[:, :, start:start + length].copy_(data[:, :, src:src + length])


    # -- INT8 on the link (ALISE Eq. 8): quantized here, so the host copy carries INT8 -------

    def packed_nbytes(self, num_blocks: int) -> int:
        return int8.packed_nbytes(self.num_layers, num_blocks, self.block_size,
                                  self.num_kv_heads * self.head_dim)

    def _packed(self, buf: torch.Tensor, num_blocks: int) -> int8.QuantizedBlocks:
        return int8.packed_views(buf, self.num_layers, num_blocks, self.block_size,
                                 self.num_kv_heads, self.head_dim, self.cache.dtype)

    def export_blocks_int8(self, block_ids: list[int], num_tokens: int | None = None,
                    out: torch.Tensor | None = None) -> torch.Tensor:
        """One request's blocks (in order) quantized where the pool lives, one layer at a
        time, then copied to ``out`` (a flat uint8 host buffer of ``packed_nbytes``)."""
        self.check_block_ids(block_ids)
        n, device = len(block_ids), self.cache.device
        nbytes = self.packed_nbytes(n)
        direct = out is not None and out.device == device
        buf = out[:nbytes] if direct else torch.empty(nbytes, dtype=torch.uint8, device=device)
        views, idx = self._packed(buf, n), torch.tensor(block_ids, device=device)
        for first, last in self._layer_chunks(n):
            q = int8.quantize(self.cache[first:last].index_select(2, idx), num_tokens)
            for dst, src in zip(views, q):
                dst[first:last].copy_(src)
        if direct:
            return out
        if out is None:
            return buf.to("cpu")
        out[:nbytes].copy_(buf)
        return out

    def import_blocks_int8(self, block_ids: list[int], data: torch.Tensor) -> None:
        """The inverse of ``export_blocks_int8``: the packed bytes go to the pool's device, where
        they are dequantized into the blocks."""
        self.check_block_ids(block_ids)
        n, device = len(block_ids), self.cache.device
        buf = data[:self.packed_nbytes(n)].to(device, non_blocking=True)
        views, idx = self._packed(buf, n), torch.tensor(block_ids, device=device)
        for first, last in self._layer_chunks(n):
            q = int8.QuantizedBlocks(*(v[first:last] for v in views))
            self.cache[first:last].index_copy_(2, idx, int8.dequantize(q, self.cache.dtype))

    def _layer_chunks(self, num_blocks: int):
        """Layers coded together: each of the codec's ops then runs once per chunk instead of
        once per layer (on a GPU, launches rather than bytes set the time of a request's
        swap), while its fp32 temporaries stay within ``CODEC_CHUNK_ELEMENTS``."""
        per_layer = 2 * num_blocks * self.block_size * self.num_kv_heads * self.head_dim
        step = self.codec_layers or max(1, min(self.num_layers,
                                                CODEC_CHUNK_ELEMENTS // max(1, per_layer)))
        for first in range(0, self.num_layers, step):
            yield first, min(first + step, self.num_layers)


def _copy_by_slices(dst: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
    """``dst.copy_(src)`` across devices, one ``[layer, k]`` slice at a time where ``dst`` or
    ``src`` is a strided host tensor (a run of blocks in a host pool laid out ``[layers, 2,
    blocks, ...]``). torch copies between a device and a strided host tensor through a pageable
    temporary and a pass on one CPU thread: 1.3-1.6 GB/s against the link's 55 on an H100.
    Each slice is contiguous, so each is one copy at the link's speed (pinned memory)."""
    host = src if dst.device.type == "cuda" else dst
    if (host.is_contiguous() or host.device.type != "cpu" or dst.device == src.device
            or not host[0, 0].is_contiguous()):
        return dst.copy_(src)
    for layer in range(dst.shape[0]):
        for k in range(dst.shape[1]):
            dst[layer, k].copy_(src[layer, k])
    return dst


def _runs(block_ids: list[int]):
    """(first block id, position in block_ids, length) of each run of consecutive ids."""
    i = 0
    while i < len(block_ids):
        j = i + 1
        while j < len(block_ids) and block_ids[j] == block_ids[j - 1] + 1:
            j += 1
        yield block_ids[i], i, j - i
        i = j


def slot_mapping(block_table: list[int], start: int, num_tokens: int, block_size: int) -> list[int]:
    """Flat cache slots of positions ``start .. start + num_tokens - 1`` of one request."""
    return [block_table[p // block_size] * block_size + p % block_size
            for p in range(start, start + num_tokens)]


class BlockAllocator:
    """Free-list bookkeeping of device blocks for callers without a scheduler."""

    def __init__(self, num_blocks: int):
        self.num_blocks = num_blocks
        self._free = list(range(num_blocks - 1, -1, -1))
        self._used: set[int] = set()

    @property
    def num_free(self) -> int:
        return len(self._free)

    def allocate(self, n: int) -> list[int]:
        if n > len(self._free):
            raise MemoryError(f"asked for {n} KV blocks, {len(self._free)} free")
        blocks = [self._free.pop() for _ in range(n)]
        self._used.update(blocks)
        return blocks

    def free(self, blocks: list[int]) -> None:
        for b in blocks:
            if b not in self._used:
                raise ValueError(f"block {b} is not allocated")
            self._used.remove(b)
            self._free.append(b)

    def check_integrity(self) -> None:
        """Every block is either free or used, never both, never twice."""
        free = set(self._free)
        assert len(free) == len(self._free), "a block is on the free list twice"
        assert not free & self._used, "a block is both free and used"
        assert free | self._used == set(range(self.num_blocks)), "a block was lost"
