"""Pins: cached blocks held for a queued request that the policy is about to admit.

A host-tier upload is issued when the policy picks its request (``prefix_host.fetch``), not
when the request arrives: behind a queue, blocks uploaded at arrival sat free on the device
and other admissions evicted them before their request ran. Each uploaded block, and the
free cached blocks of the same prefix on the device (the head of the chain the uploads
extend), is *pinned* to the request: one reference, so the LRU never evicts it, until the
request is admitted (its table then holds the blocks), aborted or finished, or not picked
again within ``PIN_ITERATIONS`` iterations.

A pin never keeps another request out: a block only a pin holds counts as free and an
allocation takes it when no plain or cached free block is left (the pin dropped, its KV
evicted), so every admission that fits without pins fits with them. The one exception is
a block uploaded this iteration (*fresh*): its copy is in flight, so it is neither free nor
taken until the copy has landed (``land``, after the iteration). At most ``limit`` blocks
are pinned at once.
"""
from __future__ import annotations

# Iterations a pin outlives the last time the policy picked its request.
PIN_ITERATIONS = 8


class Pins:
    def __init__(self, bm, limit: int):
        self.bm, self.limit = bm, max(1, limit)
        self.of: dict[str, list[int]] = {}      # request id -> its pinned blocks, chain order
        self.owner: dict[int, str] = {}         # pinned block -> request id
        self.fresh: set[int] = set()            # uploaded this iteration: copy in flight

    def __len__(self) -> int:
        return len(self.owner)

    def num_free(self) -> int:
        """Pinned blocks nobody else holds whose copy has landed (free for an allocation)."""
        ref, fresh = self.bm._ref, self.fresh
        return sum(1 for b in self.owner if ref[b] == 1 and b not in fresh) if self.owner else 0

    def is_free(self, block: int) -> bool:
        return block in self.owner and self.bm._ref[block] == 1 and block not in self.fresh

    def pin(self, rid: str, block: int, fresh: bool = False) -> None:
        """Pin ``block`` (free cached, or a fresh upload target held by nobody) to ``rid``."""
        assert block not in self.owner and self.bm._ref[block] == 0, block
        cached = self.bm.prefix.free_cached
        if block in cached:
            del cached[block]
        self.bm._ref[block] = 1
        self.owner[block] = rid
        self.of.setdefault(rid, []).append(block)
        if fresh:
            self.fresh.add(block)

    def release(self, rid: str) -> None:
        """Drop every pin of ``rid`` (admitted, ended, or not picked for a while)."""
        for block in self.of.pop(rid, ()):
            del self.owner[block]
            self._unref(block)

    def clear(self) -> None:
        """Drop every pin (the cache is being reset)."""
        for rid in list(self.of):
            self.release(rid)

    def steal(self) -> None:
        """An allocation needs a block and only pinned ones are left: unpin the last free one
        (a chain's tail first), leaving it free and cached, next to be evicted."""
        for rid in reversed(self.of):
            blocks = self.of[rid]
            for i in range(len(blocks) - 1, -1, -1):
                if self.is_free(blocks[i]):
                    block = blocks.pop(i)
                    if not blocks:
                        del self.of[rid]
                    del self.owner[block]
                    self._unref(block)
                    self.bm.prefix.free_cached.move_to_end(block, last=False)
                    return
        raise AssertionError("no pinned block is free")

    def drop_block(self, block: int) -> None:
        """Unpin one block (its upload failed: the KV is garbage)."""
        rid = self.owner.pop(block, None)
        if rid is not None:
            self.of[rid].remove(block)
            if not self.of[rid]:
                del self.of[rid]
            self._unref(block)

    def _unref(self, block: int) -> None:
        bm = self.bm
        bm._ref[block] -= 1
        if bm._ref[block]:
            return                          # a table holds it too
        if block in self.fresh:
            bm._deferred.append(block)      # unclaimable until its copy lands
        elif bm.prefix.is_cached(block):
            bm.prefix.free_cached[block] = None
        else:
            bm._free.append(block)

    def land(self) -> None:
        """The iteration's uploads have landed."""
        self.fresh.clear()

    def check(self, holders: dict[int, list]) -> None:
        assert set(self.owner) == {b for blocks in self.of.values() for b in blocks}, "pin maps"
        assert len(self.owner) <= self.limit, "too many pinned blocks"
        assert self.fresh <= set(self.owner) | set(holders) | set(self.bm._deferred), "fresh"
        for block in self.owner:
            assert self.bm._ref[block] == len(holders.get(block, ())) + 1, f"pin of {block}"
            assert block not in self.bm.prefix.free_cached, f"pinned block {block} in the LRU"
            assert self.bm.prefix.is_cached(block), f"pinned block {block} holds no cached KV"
