"""The executor's end of the shared-memory block moves: segments a kvmanager named, mapped by
name and viewed as ``[num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim]`` in the
KV pool's dtype (the layout of ``export_blocks``)."""
from __future__ import annotations

import math
import threading
from collections import OrderedDict

import torch

from lenserve_contract.errors import InvalidRequestError
from services import shm
from services.executor.types import ModelInfo


class AttachedSegments:
    """At most ``limit`` mappings, least recently used dropped first; one whose name its
    creator removed (it grew a new segment) is dropped when next seen."""

    def __init__(self, info: ModelInfo, limit: int = 8):
        dtype = getattr(torch, info.dtype, None)
        if not isinstance(dtype, torch.dtype):
            raise TypeError(f"model dtype {info.dtype!r} is not a torch dtype")
        self.dtype = dtype
        self.block_shape = (info.num_layers, 2, info.block_size, info.num_kv_heads,
                            info.head_dim)
        self.limit = limit
        self._segments: OrderedDict[str, shm.Segment] = OrderedDict()

    def view(self, name: str, num_blocks: int) -> torch.Tensor:
        """InvalidRequestError (field ``shm_name``) for a segment that is not there, not
        ours, or too small for ``num_blocks``."""
        if num_blocks < 1:
            raise InvalidRequestError("a block move needs at least one block", field="block_ids")
        layers, kv, *rest = self.block_shape
        try:
            return self._segment(name).blocks((layers, kv, num_blocks, *rest), self.dtype)
        except shm.SegmentError as exc:
            raise InvalidRequestError(str(exc), field="shm_name") from None

    def bytes_view(self, name: str, num_bytes: int) -> torch.Tensor:
        """The first ``num_bytes`` of a segment as uint8 (a packed INT8 move)."""
        try:
            return self._segment(name).blocks((num_bytes,), torch.uint8)
        except shm.SegmentError as exc:
            raise InvalidRequestError(str(exc), field="shm_name") from None

    def _segment(self, name: str) -> shm.Segment:
        seg = self._segments.pop(name, None)
        if seg is not None and seg.unlinked():
            seg.close()
            seg = None
        if seg is None:
            seg = shm.attach(name)
        self._segments[name] = seg
        while len(self._segments) > self.limit:
            self._segments.popitem(last=False)[1].close()
        return seg

    def close(self) -> None:
        for seg in self._segments.values():
            seg.close()
        self._segments.clear()


class SharedStaging:
    """The other end: each calling thread's own segment, grown (never shrunk) to the largest
    move seen, so concurrent moves never share bytes and a steady state allocates nothing."""

    def __init__(self, info: ModelInfo):
        probe = AttachedSegments(info)
        self.dtype, self.block_shape = probe.dtype, probe.block_shape
        self._local = threading.local()
        self._all: list[shm.Segment] = []
        self._lock = threading.Lock()

    def segment(self, num_blocks: int) -> tuple[shm.Segment, torch.Tensor]:
        """This thread's segment and its view of ``num_blocks`` blocks."""
        layers, kv, *rest = self.block_shape
        shape = (layers, kv, num_blocks, *rest)
        need = math.prod(shape) * torch.empty(0, dtype=self.dtype).element_size()
        seg = self._at_least(need)
        return seg, seg.blocks(shape, self.dtype)

    def byte_segment(self, num_bytes: int) -> tuple[shm.Segment, torch.Tensor]:
        """This thread's segment and its first ``num_bytes`` as uint8 (packed INT8 blocks)."""
        seg = self._at_least(num_bytes)
        return seg, seg.blocks((num_bytes,), torch.uint8)

    def _at_least(self, need: int) -> shm.Segment:
        seg = getattr(self._local, "segment", None)
        if seg is None or seg.size < need:
            seg = self._grow(seg, need)
        return seg

    def view(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """A staging buffer in shared memory (``Copier.staging``'s contract): a move through
        it needs no copy on this side. A flat uint8 buffer is a packed INT8 move."""
        if dtype == torch.uint8 and len(shape) == 1:
            return self.byte_segment(shape[0])[1]
        if dtype != self.dtype or tuple(shape[:2]) != self.block_shape[:2] \
                or tuple(shape[3:]) != self.block_shape[2:]:
            raise ValueError(f"staging {tuple(shape)} {dtype} is not this executor's block "
                             f"layout")
        return self.segment(shape[2])[1]

    def _grow(self, old: shm.Segment | None, need: int) -> shm.Segment:
        size = 1 << max(need - 1, 1).bit_length()
        seg = shm.create(size)
        with self._lock:
            self._all.append(seg)
            if old is not None:
                self._all.remove(old)
                old.close()
        self._local.segment = seg
        return seg

    def close(self) -> None:
        with self._lock:
            for seg in self._all:
                seg.close()
            self._all.clear()
