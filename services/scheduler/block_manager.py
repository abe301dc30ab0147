"""Device KV block accounting. The scheduler decides which blocks a request owns; the executor
only reads the block tables it is handed.

Besides plain growth, the manager supports two things length-aware policies need: allocating
a request's blocks up to a target length at once (max- or exact-allocation from a predicted
length) and lending the unused tail of one request's allocation to another (EconoServe's KV
pipelining, recursive: a borrower may lend on part of what it borrowed). A lent block sits in
the borrower's table until the borrower frees it, then goes back to the nearest lender still
running, or to the free pool if every lender of it has finished.

Loans name the lender by (request id, generation): a table gets a fresh generation whenever it
is created, so a request that reuses a finished lender's id never inherits its loans.

Blocks of a swap-out are freed *deferred*: they stay out of the free list until the copy that
reads them has finished (``release_deferred``), so the copy overlaps the next iteration
without the blocks being handed to anyone meanwhile.
"""
from __future__ import annotations


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int):
        self.num_blocks = num_blocks
        self.block_size = block_size
        # Popping from the end hands out low ids first, which keeps runs reproducible.
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))
        self._tables: dict[str, list[int]] = {}
        # borrower -> [[chain of (lender, lender generation), nearest first], blocks]
        self._loans: dict[str, list[list]] = {}
        self._gen: dict[str, int] = {}       # request id -> generation of its current table
        self._next_gen = 0
        # Bumped whenever a table changes other than by appending (lend, loan return, free):
        # a receiver of block-table deltas must then be sent the whole table again.
        self._epoch: dict[str, int] = {}
        self._deferred: list[int] = []

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def block_table(self, request_id: str) -> list[int]:
        """The request's blocks in position order (the live list: copy before handing it out)."""
        return self._tables.get(request_id, _EMPTY)

    @property
    def tables(self) -> dict[str, list[int]]:
        """Every request's live table (read only: a policy's hot loop checks whether a table
        already holds its tokens before asking ``allocate_slots``)."""
        return self._tables

    def num_blocks_of(self, request_id: str) -> int:
        return len(self._tables.get(request_id, _EMPTY))

    def epoch(self, request_id: str) -> int:
        return self._epoch.get(request_id, 0)

    @property
    def num_deferred_blocks(self) -> int:
        return len(self._deferred)

    def _new_table(self, request_id: str) -> list[int]:
        self._next_gen += 1
        self._gen[request_id] = self._next_gen
        self._epoch[request_id] = self._next_gen
        table = self._tables[request_id] = []
        return table

    def can_allocate(self, request_id: str, num_tokens: int) -> bool:
        need = self.blocks_for(num_tokens) - self.num_blocks_of(request_id)
        return need <= len(self._free)

    def allocate_slots(self, request_id: str, num_tokens: int) -> bool:
        """Grow the request's table to hold ``num_tokens`` tokens. All or nothing: on False
        nothing changed."""
        table = self._tables.get(request_id)
        if table is not None and num_tokens <= len(table) * self.block_size:
            return True     # the common case: a decode step within its last block
        have = len(table) if table is not None else 0
        need = -(-num_tokens // self.block_size) - have
        if need <= 0:
            return True
        if need > len(self._free):
            return False
        if table is None:
            table = self._new_table(request_id)
        free = self._free
        table.extend(free[-need:][::-1])
        del free[-need:]
        return True

    def free(self, request_id: str, *, defer: bool = False) -> list[int]:
        """Release every block the request holds; borrowed blocks go back to their lender.
        Returns the blocks the request held, in position order. ``defer``: the request's own
        blocks wait in a side list until ``release_deferred`` (a copy still reads them)."""
        table = self._tables.pop(request_id, [])
        self._gen.pop(request_id, None)
        self._epoch.pop(request_id, None)
        borrowed = set()
        for chain, blocks in self._loans.pop(request_id, ()):
            borrowed.update(blocks)
            self._return(chain, blocks)
        own = [b for b in reversed(table) if b not in borrowed] if borrowed else table[::-1]
        (self._deferred if defer else self._free).extend(own)
        return table

    def release_deferred(self) -> int:
        """Return the blocks of finished swap-out copies to the free list."""
        n = len(self._deferred)
        self._free.extend(self._deferred)
        self._deferred.clear()
        return n

    def _bump(self, request_id: str) -> None:
        self._next_gen += 1
        self._epoch[request_id] = self._next_gen

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
        self._bump(lender_id)
        borrower = self._tables.get(borrower_id)
        if borrower is None:
            borrower = self._new_table(borrower_id)
        borrower.extend(blocks)
        me = (lender_id, self._gen[lender_id])
        # Blocks the lender itself borrowed are lent on (recursive pipelining): the new loan
        # names the lender first, then whoever lent them to it, so that they go back to the
        # first of them still running.
        moved, loans = set(blocks), self._loans.setdefault(borrower_id, [])
        for loan in self._loans.get(lender_id, []):
            passed = [b for b in loan[1] if b in moved]
            if passed:
                loan[1][:] = [b for b in loan[1] if b not in moved]
                moved.difference_update(passed)
                loans.append([(me, *loan[0]), passed])
        if lender_id in self._loans:
            self._loans[lender_id] = [loan for loan in self._loans[lender_id] if loan[1]]
        if moved:
            loans.append([(me,), [b for b in blocks if b in moved]])
        return blocks

    def _return(self, chain: tuple[tuple[str, int], ...], blocks: list[int]) -> None:
        """Lent blocks go back to the first lender of the chain still running (a loan of the
        rest of the chain again), else to the free pool."""
        for i, (lender, gen) in enumerate(chain):
            if self._gen.get(lender) == gen:
                self._tables[lender].extend(blocks)
                self._bump(lender)
                if i + 1 < len(chain):
                    self._loans.setdefault(lender, []).append([chain[i + 1:], blocks])
                return
        self._free.extend(reversed(blocks))

    def check_integrity(self) -> None:
        """Every block is free or owned by exactly one table; loans name blocks the borrower
        holds. Raises AssertionError on the first violation."""
        owner: dict[int, str] = {}
        for rid, table in self._tables.items():
            for b in table:
                assert 0 <= b < self.num_blocks, f"block {b} of {rid} out of range"
                assert b not in owner, f"block {b} owned by both {owner[b]} and {rid}"
                owner[b] = rid
        unowned = self._free + self._deferred
        for b in unowned:
            assert b not in owner, f"free block {b} also owned by {owner.get(b)}"
        assert len(set(unowned)) == len(unowned), "duplicate block in the free/deferred lists"
        assert len(owner) + len(unowned) == self.num_blocks, (
            f"{self.num_blocks - len(owner) - len(unowned)} blocks leaked")
        assert set(self._gen) == set(self._tables), "generation without table (or vice versa)"
        for borrower, loans in self._loans.items():
            for _, blocks in loans:
                assert all(owner.get(b) == borrower for b in blocks), f"loan to {borrower} lost"

    def owners(self) -> set[str]:
        return set(self._tables)


_EMPTY: list[int] = []
