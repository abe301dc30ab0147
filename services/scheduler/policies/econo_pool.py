"""EconoServe's KV pipelining across the whole pool (``lend_scope=pool``), a mixin of
``EconoServePolicy``.

The paper lends the unused second half of one hosting GT's allocation to a hosted GT that
ends, buffer included, before the host writes there (§3.2), hosting GT groups by hosted GT
groups "randomly mapped". With paged KV a guest's blocks need not lie in one host's range:
every running GT's unwritten tail can be lent to any queued GT that ends before the tails
are needed. Here that is done for all GTs at once. A running GT writes its blocks as it
decodes, and its *projected* use, ``blocks_for(min(tokens + t, allocation))`` at ``t``
iterations from now, lasts until its predicted end plus the safety buffer
(``buffer_ratio`` x its remainder). A queued GT starts only if the sum of these projections,
its own included, stays within the GT share of the pool (the pool less the reserve still free
for prompts and the KV of tasks that do not decode) at every future iteration: no running GT
meets an allocation failure unless it outlives its prediction plus the buffer, as with the
exact allocation, while the reserved-but-unwritten tails carry other GTs instead of sitting
empty. With the per-host scope (``lend_scope=host``) a host lends only halves of its own
range to guests of at most half its remainder, which few queued GTs are short enough for.

The head's reservation (``econo_backfill.py``) is kept in the same terms: the head's earliest
start on the projection is held, and a smaller GT starts meanwhile only if the head still fits
there with it.
"""
from __future__ import annotations

import numpy as np

from services.scheduler.request import Request, RequestStatus

_RUNNING = RequestStatus.RUNNING
_BACKFILL_STEPS = 64     # size-index steps per selection while the head waits


def projection(n: np.ndarray, target: np.ndarray, span: np.ndarray, block_size: int) -> np.ndarray:
    """Sum over GTs of ``blocks_for(min(n + t, target))`` for ``t < span`` (0 after), for
    ``t`` in ``[0, max(span))``: what ``_use`` of each GT, added up, gives. Built from the
    iterations where a GT's use changes (it starts, takes one more block, ends) and one
    cumulative sum, so the work is per block a GT will take, not per iteration it will run:
    a block holds ``block_size`` tokens, so about ``block_size`` times fewer entries than the
    projection's iterations summed over GTs."""
    first = -(-np.minimum(n, target) // block_size)                   # blocks at t = 0
    last = -(-np.minimum(n + span - 1, target) // block_size)         # at t = span - 1
    steps = last - first          # one more block at t where n + t = k * block_size + 1
    k = np.repeat(first, steps) + (np.arange(int(steps.sum()), dtype=np.int64)
                                   - np.repeat(np.cumsum(steps) - steps, steps))
    at = k * block_size + 1 - np.repeat(n, steps)
    length = int(span.max())
    diff = np.bincount(at, minlength=length + 1)[:length + 1].astype(np.int64)
    diff[0] += int(first.sum())
    diff -= np.bincount(span, weights=last, minlength=length + 1).astype(np.int64)
    return np.cumsum(diff[:length])


class PoolLendingMixin:
    # Provided by the policy: options, model, active, prefilling, reserved_blocks.

    def _use(self, req: Request, bm) -> np.ndarray:
        """Blocks the GT holds at each iteration from now until its predicted end plus the
        buffer (its whole allocation from the end of its prediction on)."""
        n, target = req.num_tokens, self.model.target_tokens(req)
        remaining = max(target - n, 1)
        span = remaining + int(self.options.buffer_ratio * remaining)
        tokens = np.minimum(n + np.arange(span), target)
        return -(-tokens // bm.block_size)

    def _pool_plan(self, bm) -> None:
        """The running GTs' summed projection and the blocks GTs may use: the pool less the
        blocks of tasks not decoding (waiting GTs, prefilling prompts) and the part of the
        reserve the prompts have not taken. The projection is ``_use`` of every running GT,
        summed by ``projection`` from the iterations where it changes."""
        ns, targets, active_held = [], [], 0
        for rid, req in self.active.items():
            if req.status is not _RUNNING:
                continue
            ns.append(req.num_tokens)
            targets.append(self.model.target_tokens(req))
            active_held += bm.num_blocks_of(rid)
        if ns:
            n, target = np.array(ns, dtype=np.int64), np.array(targets, dtype=np.int64)
            remaining = np.maximum(target - n, 1)
            span = remaining + (self.options.buffer_ratio * remaining).astype(np.int64)
            prof = projection(n, target, span, bm.block_size)
        else:
            prof = np.zeros(1, dtype=np.int64)
        prefilling = sum(bm.num_blocks_of(rid) for rid in self.prefilling)
        idle = bm.num_blocks - bm.num_free_blocks - active_held     # held, not decoding
        self._prof = prof
        self._cap = bm.num_blocks - idle - max(self.reserved_blocks - prefilling, 0)

    def _pool_slack(self, req: Request, bm, start: int = 0, prof=None) -> int:
        """Blocks to spare at the tightest future iteration if ``req`` started ``start``
        iterations from now (negative: it does not fit)."""
        prof = self._prof if prof is None else prof
        use = self._use(req, bm)
        end = start + len(use)
        window = prof[start:end]
        if len(window) < len(use):
            window = np.pad(window, (0, len(use) - len(window)))
        own = 0 if req.status is not _RUNNING else bm.num_blocks_of(req.request_id)
        return int(self._cap + own - (window + use).max())

    def _pool_add(self, req: Request, bm, start: int = 0, prof=None) -> np.ndarray:
        """The projection with ``req`` started ``start`` iterations from now."""
        prof = self._prof if prof is None else prof
        use = self._use(req, bm)
        end = start + len(use)
        if end > len(prof):
            prof = np.pad(prof, (0, end - len(prof)))
        else:
            prof = prof.copy()
        prof[start:end] += use
        return prof

    def _pool_start(self, req: Request, bm, own: int) -> None:
        """Account a GT that starts now: its projection joins, the ``own`` blocks it held
        leave the idle ones."""
        self._prof = self._pool_add(req, bm)
        self._cap += own

    def _pool_earliest(self, req: Request, bm) -> int | None:
        """The earliest iteration from now at which ``req`` fits the projection: it falls
        only where a running GT's projection ends."""
        prof = self._prof
        drops = np.nonzero(np.diff(prof, append=0) < 0)[0] + 1
        for start in (0, *drops.tolist()):
            if self._pool_slack(req, bm, start) >= 0:
                return start
        return None

    def _pool_backfill(self, state, output, head: Request, tokens: int) -> int:
        """The head does not fit the projection: promise it its earliest start (fixed when it
        first waits at the head) and start smaller GTs only if the head still fits there with
        them. At the promised iteration, waiting GTs holding the KV it needs (prompts
        prefilled meanwhile) are recomputed to keep the promise."""
        bm, rid, now = state.block_manager, head.request_id, self._iteration
        start = self._pool_earliest(head, bm)
        if self._promise is None or self._promise[0] != rid:
            self._promise = (rid, now + (start or 0))
        promise = self._promise[1]
        if now >= promise or start is None:
            held = self._evictable(bm, head)
            if self._pool_slack(head, bm) + held >= 0:
                self._evict_queued(state, output, head, lambda b: self._room_for(head, b))
                if self._pool_slack(head, bm) >= 0:
                    return self._activate(state, output, head, tokens)
            self._wake = now + 1      # running GTs outlive their prediction: look again
            return tokens
        start = min(start, promise - now)
        self._wake = now + start if self._wake is None else min(self._wake, now + start)
        shadow = self._pool_add(head, bm, start)
        bound = bm.num_blocks
        for _ in range(_BACKFILL_STEPS):
            if tokens <= 0 or bound < 0:
                break
            cand = self.gts.largest_fitting(bound)
            if cand is None:
                break
            if cand is not head and self._pool_slack(cand, bm, 0, shadow) >= 0:
                shadow = self._pool_add(cand, bm, 0, shadow)
                tokens = self._activate(state, output, cand, tokens)
            else:
                bound = self.gts.size_of(cand) - 1
        return tokens

    def _room_for(self, head: Request, bm) -> int:
        """``head``'s size plus its slack on a fresh projection (``_evict_queued``'s room)."""
        self._pool_plan(bm)
        return self.gts.size_of(head) + self._pool_slack(head, bm)
