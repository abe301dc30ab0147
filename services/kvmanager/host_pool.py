"""The host block pool: preallocated storage of N blocks and who owns which block.

N is the swap space divided by the real bytes of one host block (INT8 codes *and* their
scales), so the pool never holds more than it was given. Allocation is per request and
all-or-nothing: a request either gets every block it asked for or nothing changes.
"""
from __future__ import annotations

import torch

from services.kvmanager.host_store import BlockLayout, FpHostStore, Int8HostStore
from services.kvmanager.interface import HostPoolFullError


class HostBlockAllocator:
    """Free set and owners of N host blocks.

    The free set is a mask rather than a stack so that a request can be given consecutive
    blocks when a long enough run is free: a consecutive run is a view of the store, and the
    executor exports into it with no staging copy."""

    def __init__(self, num_blocks: int):
        self.num_blocks = num_blocks
        self._free = torch.ones(num_blocks, dtype=torch.bool)
        self._num_free = num_blocks
        self._owned: dict[str, list[int]] = {}

    @property
    def num_free(self) -> int:
        return self._num_free

    def owners(self) -> list[str]:
        return list(self._owned)

    def blocks_of(self, owner: str) -> list[int]:
        return self._owned[owner]

    def allocate(self, owner: str, n: int) -> list[int]:
        if owner in self._owned:
            raise ValueError(f"request {owner!r} already owns host blocks")
        if n < 1:
            raise ValueError(f"a request needs at least one host block, asked for {n}")
        if n > self._num_free:
            raise HostPoolFullError(owner, n, self._num_free)
        blocks = self._first_run(n) or self._lowest_free(n)
        self._free[blocks] = False
        self._num_free -= n
        self._owned[owner] = blocks
        return blocks

    def extend(self, owner: str, n: int) -> list[int]:
        """Give ``owner`` ``n`` more blocks (a streamed request's KV grows in the host tier);
        all or nothing. Returns its whole list, the new blocks last."""
        if n > self._num_free:
            raise HostPoolFullError(owner, n, self._num_free)
        blocks = self._lowest_free(n)
        self._free[blocks] = False
        self._num_free -= n
        self._owned[owner] = self._owned[owner] + blocks
        return self._owned[owner]

    def shrink(self, owner: str, n: int) -> list[int]:
        """Keep only the first ``n`` (>= 1) of ``owner``'s blocks (a streamed request's growth
        for an iteration that did not run)."""
        blocks = self._owned[owner]
        extra = blocks[n:]
        self._free[extra] = True
        self._num_free += len(extra)
        self._owned[owner] = blocks[:n]
        return self._owned[owner]

    def release(self, owner: str) -> list[int]:
        blocks = self._owned.pop(owner)
        self._free[blocks] = True
        self._num_free += len(blocks)
        return blocks

    def _first_run(self, n: int) -> list[int] | None:
        # free_before[i] = free blocks among 0..i-1, so a window's free count is a difference.
        free_before = torch.zeros(self.num_blocks + 1, dtype=torch.int64)
        free_before[1:] = self._free.cumsum(0)
        starts = torch.nonzero(free_before[n:] - free_before[:-n] == n)
        if starts.numel() == 0:
            return None
        first = int(starts[0])
        return list(range(first, first + n))

    def _lowest_free(self, n: int) -> list[int]:
        return torch.nonzero(self._free).flatten()[:n].tolist()

    def check_integrity(self) -> None:
        owned = [b for blocks in self._owned.values() for b in blocks]
        free = set(torch.nonzero(self._free).flatten().tolist())
        assert len(owned) == len(set(owned)), "a host block is owned twice"
        assert all(0 <= b < self.num_blocks for b in owned), "an owned host block id is unknown"
        assert not free & set(owned), "a host block is both free and owned"
        assert len(free) == self._num_free, "the free count disagrees with the free set"
        assert len(free) + len(owned) == self.num_blocks, "a host block was lost"


def host_block_bytes(layout: BlockLayout, int8: bool) -> int:
    """Host bytes of one block, INT8 scales and offsets included."""
    return (Int8HostStore if int8 else FpHostStore).block_bytes(layout)


class HostBlockPool:
    def __init__(self, layout: BlockLayout, swap_space_bytes: int, int8: bool, pin: bool):
        if int8 and not layout.dtype.is_floating_point:
            raise ValueError(f"INT8 KV compression needs a floating-point KV cache, not "
                             f"{layout.dtype}")
        store_cls = Int8HostStore if int8 else FpHostStore
        self.int8 = int8
        self.block_bytes = host_block_bytes(layout, int8)
        self.num_blocks = swap_space_bytes // self.block_bytes
        self.store = store_cls(layout, self.num_blocks, pin)
        self.allocator = HostBlockAllocator(self.num_blocks)

    @property
    def num_free(self) -> int:
        return self.allocator.num_free

    @property
    def bytes_used(self) -> int:
        return (self.num_blocks - self.num_free) * self.block_bytes

    def check_integrity(self) -> None:
        self.allocator.check_integrity()
