"""EconoServe's KV pipelining (paper §3.2), as a mixin of ``EconoServePolicy``.

A running GT (the host) lends the unused part of its exact allocation to queued GTs (guests)
predicted to finish, with the safety buffer, before the host writes there: the second half of
its remainder to a GT of remainder <= l/2 - b, then the second half of what it keeps to one of
<= l/4 - b, and so on (l/8 - b, ...). A guest hosts in turn in what it borrowed (recursive:
``BlockManager.lend`` passes a borrowed block on and returns it to the nearest lender still
running). A host that will need a lent block in its next iteration takes it back: the guest
that holds it (with the guests it hosts) moves to the host tier through the KV manager
(``swap_out``: its computed KV survives, it is queued again as a GT), or, without room there,
is recomputed. The move happens one iteration early so that the copy reads the guest's blocks
while the host still writes inside its own.
"""
from __future__ import annotations

from services.scheduler.output import SchedulerOutput
from services.scheduler.request import Request, RequestStatus
from services.scheduler.state import SchedulerState

_RUNNING, _SWAPPED = RequestStatus.RUNNING, RequestStatus.SWAPPED
_SEARCH_STEPS = 32      # size-index steps per guest search: bounded work per hosting


class PipeliningMixin:
    # Provided by the policy: options, model, gts, active, keys, guests, lender_of,
    # _start, _queue_gt, _queue_pt, _unlink, _due, num_guest_moves.

    def _host(self, state: SchedulerState, output: SchedulerOutput, host: Request,
              tokens: int) -> int:
        """Lend halves of the host's unused allocation, level by level, each to a queued GT
        that ends (buffer included) before the host writes there; recurse into each guest."""
        bm, rid = state.block_manager, host.request_id
        remaining = self.model.remaining(host)
        buffer = int(self.options.buffer_ratio * remaining)
        share = remaining
        while tokens > 0 and self.gts:
            share //= 2
            limit = share - buffer
            if limit < 1:
                break
            keep = host.num_tokens + (remaining - share)
            spare = bm.num_blocks_of(rid) - bm.blocks_for(keep)
            guest = self._guest(spare, limit)
            if guest is None:
                continue
            need = self.gts.size_of(guest)
            self.gts.remove(guest)
            if need:
                bm.lend(rid, guest.request_id, need, keep)
                self.lender_of[guest.request_id] = rid
                self.guests.setdefault(rid, []).append(guest)
            self._start(guest, output)
            self.num_hosted += 1
            tokens -= 1
            if need:
                tokens = self._host(state, output, guest, tokens)
            remaining = keep - host.num_tokens          # the next level halves what is kept
            share = remaining
            buffer = int(self.options.buffer_ratio * remaining)
        return tokens

    def _guest(self, spare_blocks: int, limit_tokens: int) -> Request | None:
        """The largest queued GT that fits the lent blocks and is predicted to end within
        ``limit_tokens``. The largest fitting one alone is usually too long (a GT's blocks
        grow with its predicted remainder): step down the size index past each miss. A GT on
        the host tier, or one already in a loan, is passed over."""
        bound = spare_blocks
        for _ in range(_SEARCH_STEPS):
            if bound <= 0:
                return None
            guest = self.gts.largest_fitting(bound)
            if guest is None:
                return None
            rid = guest.request_id
            if (guest.status is _RUNNING and rid not in self.lender_of
                    and not self.guests.get(rid)
                    and self.model.remaining(guest) <= limit_tokens):
                return guest
            bound = self.gts.size_of(guest) - 1
        return None

    def _lend_idle_halves(self, state: SchedulerState, output: SchedulerOutput,
                          tokens: int) -> int:
        """GTs still waiting: running GTs lend what is unused of their allocation now (never
        lent, or a guest finished and its blocks came back)."""
        for host in list(self.active.values()):
            if tokens <= 0 or not self.gts:
                break
            if host.status is _RUNNING and host.request_id in self.active:
                tokens = self._host(state, output, host, tokens)
        return tokens

    def _reclaim_loans(self, state: SchedulerState, output: SchedulerOutput) -> None:
        """Hosts that will write past their own blocks in the next iteration take the most
        recent loan back, before any request of this iteration is scheduled."""
        bm = state.block_manager
        for rid in [r for r, gs in self.guests.items() if gs and r in self.active]:
            host = self.active[rid]
            stack = self.guests.get(rid)
            while stack and host.num_tokens + 1 > bm.num_blocks_of(rid) * bm.block_size:
                self._move_out(state, output, stack[-1])

    def _move_out(self, state: SchedulerState, output: SchedulerOutput, guest: Request) -> None:
        """Move a guest (after the guests it hosts) off the device: to the host tier when it
        has room, else by recompute."""
        for inner in list(self.guests.get(guest.request_id, ())):
            self._move_out(state, output, inner)
        self._unlink(guest)
        self._due = True
        if guest.status is _RUNNING and state.num_host_blocks > 0 \
                and state.swap_out(guest, output):
            self.num_guest_moves += 1
            self._queue_gt(guest, state.block_manager)
            return
        if guest.status is _RUNNING:
            state.preempt(guest, output)
            self._queue_pt(guest)
