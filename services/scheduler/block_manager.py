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

With prefix caching (``enable_prefix_caching``), full blocks of computed tokens are indexed
(``prefix_cache.PrefixIndex``) and shared: a block counts its holders (``_ref``), a request
admitted with a cached prefix starts with those blocks (``claim_prefix``), and a block whose
last holder leaves keeps its KV, free but cached, until a block is needed and it is the least
recently freed one. Only full blocks of computed tokens are shared and nobody writes into a
full block, so no copy-on-write is needed; lent blocks are never indexed (their owner will
overwrite them).
"""
from __future__ import annotations

from services.scheduler.prefix_cache import PrefixIndex
from services.scheduler.prefix_pins import Pins


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, *, enable_prefix_caching: bool = False,
                 cache_namespace: tuple = ()):
        self.num_blocks = num_blocks
        self.block_size = block_size
        # Popping from the end hands out low ids first, which keeps runs reproducible.
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))
        self._ref = [0] * num_blocks               # tables holding each block
        self.prefix = PrefixIndex(block_size, cache_namespace) if enable_prefix_caching else None
        # Blocks held for queued requests about to be admitted (``prefix_pins``).
        self.pins = Pins(self, num_blocks // 2)
        # request id -> [blocks of its table indexed so far, prefix id the chain ends at]
        self._chain: dict[str, list] = {}
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
        """Blocks an allocation may take: plain free ones, free cached ones (evicted) and
        pinned ones no request holds (pins never keep an admission out)."""
        prefix = self.prefix
        if prefix is None:
            return len(self._free)
        return len(self._free) + len(prefix.free_cached) + self.pins.num_free()

    @property
    def num_lent_blocks(self) -> int:
        """Blocks that sit in a borrower's table on loan (KV pipelining), each once."""
        return sum(len(blocks) for loans in self._loans.values() for _, blocks in loans)

    @property
    def num_free_uncached_blocks(self) -> int:
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
        return need <= self.num_free_blocks

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
        if need > self.num_free_blocks:
            return False
        if table is None:
            table = self._new_table(request_id)
        self._take(table, need)
        return True

    def _take(self, table: list[int], need: int) -> None:
        """Append ``need`` free blocks: plain free ones first, then the least recently freed
        cached ones (their KV forgotten)."""
        free, ref = self._free, self._ref
        plain = min(need, len(free))
        got = free[-plain:][::-1] if plain else []
        del free[len(free) - plain:]
        for _ in range(need - plain):
            if not self.prefix.free_cached:
                self.pins.steal()
            got.append(self.prefix.evict_lru())
        for b in got:
            ref[b] = 1
        table.extend(got)

    def free(self, request_id: str, *, defer: bool = False) -> list[int]:
        """Release every block the request holds; borrowed blocks go back to their lender.
        Returns the blocks the request held, in position order. ``defer``: the request's own
        blocks wait in a side list until ``release_deferred`` (a copy still reads them)."""
        table = self._tables.pop(request_id, [])
        self._gen.pop(request_id, None)
        self._epoch.pop(request_id, None)
        self._chain.pop(request_id, None)
        borrowed = set()
        for chain, blocks in self._loans.pop(request_id, ()):
            borrowed.update(blocks)
            self._return(chain, blocks)
        own = [b for b in reversed(table) if b not in borrowed] if borrowed else table[::-1]
        if self.prefix is None:
            for b in own:
                self._ref[b] = 0
            (self._deferred if defer else self._free).extend(own)
        else:
            self._release(own, defer)
        return table

    def _release(self, blocks: list[int], defer: bool) -> None:
        """Drop one holder of each block (tail first); a block nobody holds any more goes to
        the deferred list, or stays cached (most recently freed) if indexed, else is free."""
        ref, prefix = self._ref, self.prefix
        for b in blocks:
            ref[b] -= 1
            if ref[b]:
                continue                    # another request still reads it
            if defer or b in self.pins.fresh:
                self._deferred.append(b)
            elif prefix.is_cached(b):
                prefix.free_cached[b] = None
            else:
                self._free.append(b)

    def release_deferred(self) -> int:
        """Return the blocks of finished swap-out copies to the free list (or the cached LRU
        if their KV is indexed)."""
        n = len(self._deferred)
        if self.prefix is None:
            self._free.extend(self._deferred)
        else:
            for b in self._deferred:
                if self.prefix.is_cached(b):
                    self.prefix.free_cached[b] = None
                else:
                    self._free.append(b)
        self._deferred.clear()
        self.pins.land()
        return n

    # -- prefix caching ----------------------------------------------------------------------
    def match_prefix(self, token_ids: list[int]) -> list[int]:
        """Cached blocks of the longest indexed prefix of ``token_ids``, leaving at least the
        last token to compute (its logits are needed)."""
        if self.prefix is None or len(token_ids) <= self.block_size:
            return []
        return self.prefix.match(token_ids, (len(token_ids) - 1) // self.block_size)[0]

    def num_held_of(self, blocks: list[int]) -> int:
        """How many of ``blocks`` some request holds (sharing them takes no free block)."""
        ref, pinned = self._ref, self.pins.owner
        return sum(1 for b in blocks if ref[b] - (b in pinned) > 0)

    def num_free_taken_by(self, blocks: list[int]) -> int:
        """How many of ``blocks`` a claim would take out of the free count."""
        ref, cached = self._ref, self.prefix.free_cached if self.prefix else {}
        return sum(1 for b in blocks if (ref[b] == 0 and b in cached) or self.pins.is_free(b))

    def claim_prefix(self, request_id: str, blocks: list[int]) -> None:
        """Start the request's (empty) table with cached ``blocks`` from ``match_prefix``,
        sharing them."""
        assert not self._tables.get(request_id), f"{request_id} claims a prefix over its table"
        table = self._tables.get(request_id)
        if table is None:
            table = self._new_table(request_id)
        ref, cached = self._ref, self.prefix.free_cached
        for b in blocks:
            if ref[b] == 0:
                if b in cached:
                    del cached[b]
                else:
                    self._deferred.remove(b)    # a swap-out's copy still reads it: fine
            ref[b] += 1
        table.extend(blocks)
        self._chain[request_id] = [len(blocks), self.prefix.uid_of(blocks[-1])]

    def cache_computed(self, request_id: str, token_ids: list[int], num_computed: int) -> None:
        """Index the request's blocks that are now full of computed tokens (up to its first
        borrowed block: a loan's blocks go back to a lender that overwrites them)."""
        table = self._tables.get(request_id)
        if self.prefix is None or table is None:
            return
        full = min(num_computed // self.block_size, len(table))
        loans = self._loans.get(request_id)
        if loans:
            full = min(full, min(table.index(blocks[0]) for _, blocks in loans))
        chain = self._chain.get(request_id)
        if chain is None:
            chain = self._chain[request_id] = [0, self.prefix.root]
        i, parent, bs, insert = chain[0], chain[1], self.block_size, self.prefix.insert
        while i < full:
            parent = insert(table[i], parent, tuple(token_ids[i * bs:(i + 1) * bs]))
            i += 1
        chain[0], chain[1] = i, parent

    def upload_target(self, request_id: str, key: tuple, uid: int) -> int:
        """A free block for a host tier upload of ``key``: indexed now and pinned to the
        request, never handed out before ``release_deferred`` (after the copy)."""
        if self._free:
            block = self._free.pop()
        else:
            block = self.prefix.evict_lru()
        self.prefix.index(block, key, uid)
        self.pins.pin(request_id, block, fresh=True)
        return block

    def writeback_candidates(self, window: int) -> list[int]:
        """Free cached blocks within ``window`` allocations of eviction whose key the host
        tier lacks, next to be evicted first."""
        prefix, found = self.prefix, []
        host, key_of = prefix.host.entries, prefix.key_of
        for i, block in enumerate(prefix.free_cached, len(self._free)):
            if i >= window:
                break
            if key_of(block) not in host:
                found.append(block)
        return found

    def reset_prefix_cache(self) -> None:
        """Forget every cached KV (the executor lost its KV pool): nothing is served from it
        again, and free cached blocks become plain free blocks."""
        if self.prefix is not None:
            self.pins.clear()
            self._free.extend(reversed(self.prefix.clear()))
            self._chain.clear()

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
        if any(self._ref[b] != 1 for b in blocks):
            raise ValueError(f"{lender_id} cannot lend blocks another request shares")
        if self.prefix is not None:
            for b in blocks:
                self.prefix.drop(b)     # the borrower overwrites them
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
        for b in blocks:
            self._ref[b] = 0
        self._free.extend(reversed(blocks))

    def check_integrity(self) -> None:
        """Every block is free (plain, cached or deferred) or held, and its holder count is
        the number of tables holding it; a block two tables share is indexed and sits at the
        same position in both; loans name blocks only the borrower holds; the prefix index
        agrees with itself. Raises AssertionError on the first violation."""
        holders: dict[int, list[tuple[str, int]]] = {}
        for rid, table in self._tables.items():
            assert len(set(table)) == len(table), f"{rid} holds a block twice"
            for pos, b in enumerate(table):
                assert 0 <= b < self.num_blocks, f"block {b} of {rid} out of range"
                holders.setdefault(b, []).append((rid, pos))
        prefix = self.prefix
        for b, held in holders.items():
            if len(held) > 1:
                assert prefix is not None and prefix.is_cached(b), (
                    f"block {b} owned by both {held[0][0]} and {held[1][0]} but not shared KV")
                assert len({pos for _, pos in held}) == 1, f"shared block {b} at two positions"
            assert self._ref[b] == len(held) + (b in self.pins.owner), (
                f"block {b}: {self._ref[b]} holders counted, {held}")
        cached = list(prefix.free_cached) if prefix is not None else []
        if prefix is not None:
            self.pins.check(holders)
            holders.update({b: [] for b in self.pins.owner if b not in holders})
        unowned = self._free + self._deferred + cached
        for b in unowned:
            assert b not in holders, f"free block {b} also held by {holders.get(b)}"
            assert self._ref[b] == 0, f"free block {b} counts {self._ref[b]} holders"
        assert len(set(unowned)) == len(unowned), "duplicate block in the free/deferred lists"
        assert len(holders) + len(unowned) == self.num_blocks, (
            f"{self.num_blocks - len(holders) - len(unowned)} blocks leaked")
        assert set(self._gen) == set(self._tables), "generation without table (or vice versa)"
        for borrower, loans in self._loans.items():
            for _, blocks in loans:
                assert all(holders.get(b) and holders[b][0][0] == borrower and len(holders[b]) == 1
                           for b in blocks), f"loan to {borrower} lost"
        if prefix is not None:
            assert not any(prefix.is_cached(b) for b in self._free), "plain free block indexed"
            prefix.check(self._ref)
            for rid, (n, _) in self._chain.items():
                assert rid in self._tables and n <= len(self._tables[rid]), f"{rid} chain past table"
                assert all(self._tables[rid][i] in holders for i in range(n)), f"{rid} chain"

    def owners(self) -> set[str]:
        return set(self._tables)


_EMPTY: list[int] = []
