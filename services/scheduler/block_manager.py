"""Device KV block accounting. The scheduler decides which blocks a request owns; the executor
only reads the block tables it is handed.

Besides plain growth, the manager supports two things length-aware policies need: allocating
a request's blocks up to a target length at once (max- or exact-allocation from a predicted
length) and lending the unused tail of one request's allocation to another (EconoServe's KV
pipelining). A lent block sits in the borrower's table until the borrower frees it, then goes
back to the lender, or to the free pool if the lender has finished.
"""
from __future__ import annotations


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int):
        self.num_blocks = num_blocks
        self.block_size = block_size
        # Popping from the end hands out low ids first, which keeps runs reproducible.
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))
        self._tables: dict[str, list[int]] = {}
        self._loans: dict[str, list[tuple[str, list[int]]]] = {}   # borrower -> [(lender, blocks)]

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def block_table(self, request_id: str) -> list[int]:
        """The request's blocks in position order (the live list: copy before handing it out)."""
        return self._tables.get(request_id, _EMPTY)

    def num_blocks_of(self, request_id: str) -> int:
        return len(self._tables.get(request_id, _EMPTY))

    def can_allocate(self, request_id: str, num_tokens: int) -> bool:
        need = self.blocks_for(num_tokens) - self.num_blocks_of(request_id)
        return need <= len(self._free)

    def allocate_slots(self, request_id: str, num_tokens: int) -> bool:
        """Grow the request's table to hold ``num_tokens`` tokens. All or nothing: on False
        nothing changed."""
        table = self._tables.get(request_id)
        have = len(table) if table is not None else 0
        need = -(-num_tokens // self.block_size) - have
        if need <= 0:
            return True
        if need > len(self._free):
            return False
        if table is None:
            table = self._tables[request_id] = []
        free = self._free
        table.extend(free[-need:][::-1])
        del free[-need:]
        return True

    def free(self, request_id: str) -> list[int]:
        """Release every block the request holds; borrowed blocks go back to their lender.
        Returns the blocks the request held, in position order."""
        table = self._tables.pop(request_id, [])
        borrowed = set()
        for lender, blocks in self._loans.pop(request_id, ()):
            borrowed.update(blocks)
            if lender in self._tables:
                self._tables[lender].extend(blocks)
            else:
                self._free.extend(reversed(blocks))
        self._free.extend(b for b in reversed(table) if b not in borrowed)
        return table

    def lend(self, lender_id: str, borrower_id: str, num_blocks: int, lender_needs_tokens: int) -> list[int]:
        """Move the last ``num_blocks`` of the lender's table to the end of the borrower's.
        The lender keeps enough blocks for ``lender_needs_tokens``; the caller guarantees the
        lender will not write past that before the loan returns."""
        table = self._tables.get(lender_id, [])
        spare = len(table) - self.blocks_for(lender_needs_tokens)
        if not 0 < num_blocks <= spare:
            raise ValueError(f"{lender_id} can lend at most {max(spare, 0)} blocks, asked {num_blocks}")
        blocks = table[-num_blocks:]
        del table[-num_blocks:]
        self._tables.setdefault(borrower_id, []).extend(blocks)
        self._loans.setdefault(borrower_id, []).append((lender_id, blocks))
        return blocks

    def check_integrity(self) -> None:
        """Every block is free or owned by exactly one table; loans name blocks the borrower
        holds. Raises AssertionError on the first violation."""
        owner: dict[int, str] = {}
        for rid, table in self._tables.items():
            for b in table:
                assert 0 <= b < self.num_blocks, f"block {b} of {rid} out of range"
                assert b not in owner, f"block {b} owned by both {owner[b]} and {rid}"
                owner[b] = rid
        for b in self._free:
            assert b not in owner, f"free block {b} also owned by {owner.get(b)}"
        assert len(set(self._free)) == len(self._free), "duplicate block in the free list"
        assert len(owner) + len(self._free) == self.num_blocks, (
            f"{self.num_blocks - len(owner) - len(self._free)} blocks leaked")
        for borrower, loans in self._loans.items():
            for _, blocks in loans:
                assert all(owner.get(b) == borrower for b in blocks), f"loan to {borrower} lost"

    def owners(self) -> set[str]:
        return set(self._tables)


_EMPTY: list[int] = []
