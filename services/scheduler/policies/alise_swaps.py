"""ALISE's preempted KV (paper 001, Eq. 6-7 and Alg. 2): paused residents expected to wait
long are offloaded to the host tier ahead of need; swapped requests among the best M are
uploaded beside the iteration, ahead of need. A mixin of ``AlisePolicy`` (its queues, keys
and remaining times); see that module's docstring for the rules."""
from __future__ import annotations

from services.scheduler.output import SchedulerOutput
from services.scheduler.policies.ranked import _Pass
from services.scheduler.request import Request, RequestStatus
from services.scheduler.state import SchedulerState


class AliseSwaps:
    def _after_schedule(self, state: SchedulerState, output: SchedulerOutput, p: _Pass) -> None:
        served = {r.request_id for r, _ in output.scheduled}
        paused = [r for r in p.ranked if r.status is RequestStatus.RUNNING
                  and r.request_id not in served]
        for req in paused:
            job = self.jobs[req.request_id]
            if job.since is None:
                job.since = state.now
        if paused and len(self.queues) and self.options.swap and state.num_host_blocks:
            self._offload(state, output, p, served, paused)
        if self.options.upload_ahead and state.counts[RequestStatus.SWAPPED] and len(self.queues):
            self._upload_ahead(state, output, p)

    def _upload_ahead(self, state: SchedulerState, output: SchedulerOutput, p: _Pass) -> None:
        """Alg. 2, lines 5-7: swapped requests among the best M are uploaded now."""
        seats = (self.options.gpu_job_limit or state.budget.max_num_seqs) - len(state.running)
        if seats <= 0:
            return
        bm, blocks_for = state.block_manager, self.config.blocks_for
        # Room the residents need for their next step stays free (reserve_growth: the rest of
        # a prompt being prefilled too; else a decode's next block).
        grow = self._growth(state)
        free = bm.num_free_blocks - self.options.watermark_blocks - grow
        gone = p.evicted | {rid for rid, _ in output.swapped_out}
        served = max(1, len(output.scheduled))
        for key, req in self.queues.best(seats):
            need = blocks_for(req.num_computed_tokens + 1)
            if req.status is not RequestStatus.SWAPPED:
                free -= blocks_for(req.num_tokens)      # a better new request's prompt first
                continue
            # The offload's own rule read the other way (Alg. 2 sorts both by EWT): a request
            # expected to wait swap_wait_s or more would be offloaded again before it ran.
            if (req.request_id in gone or need > free
                    or self._queued_wait_s(key - self.options.aging_rate * state.now,
                                           served) >= self.options.swap_wait_s
                    or not state.swap_in(req, output)):
                return
            self.queues.discard(req)
            self._on_uploaded(req)
            free -= need

    def _growth(self, state: SchedulerState) -> int:
        """Blocks the residents lack for their next step."""
        if self.options.reserve_growth:
            return self._blocks_to_grow(state, state.running.values())
        bm, blocks_for = state.block_manager, self.config.blocks_for
        return sum(1 for rid, r in state.running.items()
                   if blocks_for(r.num_tokens + 1) > bm.num_blocks_of(rid))

    def _uploads_ahead(self, request: Request) -> bool:
        # A request rescued for its token gap must run now: that upload is the one waited for.
        return self.options.upload_ahead and not (
            self._stalled and self._stalled_head(self.now) is request)

    def _on_uploaded(self, request: Request) -> None:
        self._uploaded.add(request.request_id)
        self.num_uploads_ahead += 1

    def _queued_wait_s(self, key_now: float, num_served: int) -> float:
        """EWT of a queued request whose aged key is ``key_now``: the residents' work ranked
        ahead of it, spread over the batch (as ``estimated_wait_s``)."""
        keys, remaining = self._keys, self._remaining
        return sum(remaining[rid] for rid, k in keys.items() if k < key_now) / num_served

    def _offload(self, state, output, p: _Pass, served: set[str], paused: list[Request]) -> None:
        """Alg. 2, lines 8-9: a paused resident is offloaded when it is beyond the GPU job
        limit M, that is when queued requests ranked ahead of it need its seat or its blocks
        (memory sets M), and its EWT reaches ``swap_wait_s``; worst first. One that nobody
        needs room from stays on the device: keeping it costs nothing, a round trip costs
        two copies on the link."""
        seats, blocks = self._shortfall(state, output, p, paused)
        if seats <= 0 and blocks <= 0:
            return
        ahead, running_sum = {}, 0.0      # work ranked ahead of each resident: prefix sums
        for r in p.ranked:
            ahead[r.request_id] = running_sum
            running_sum += self._remaining.get(r.request_id, 0.0)
        best = self._keys[p.ranked[0].request_id]
        head = self.queues.head()
        first = head[0] - self.options.aging_rate * state.now
        bm = state.block_manager
        for req in reversed(paused):
            if seats <= 0 and blocks <= 0:
                return
            if req.request_id in self._uploaded or self._keys[req.request_id] <= first:
                continue        # uploaded for its coming seat, or no queued request ahead of it
            ewt = self.estimated_wait_s(req, ahead[req.request_id], len(served), best)
            held = bm.num_blocks_of(req.request_id)
            if ewt >= self.options.swap_wait_s and state.can_swap_out(req) \
                    and state.swap_out(req, output):
                self._push(req)
                seats, blocks = seats - 1, blocks - held

    def _shortfall(self, state, output, p: _Pass, paused: list[Request]) -> tuple[int, int]:
        """(seats, blocks) that the queued requests ranked ahead of the worst paused resident
        lack on the device next iteration, past what is free or being freed."""
        rate, worst = self.options.aging_rate, self._keys[paused[-1].request_id]
        bm, blocks_for = state.block_manager, self.config.blocks_for
        need = count = 0
        for key, req in self.queues.best(len(paused)):
            if key - rate * state.now >= worst:
                break
            count += 1
            need += blocks_for(req.num_computed_tokens + 1 if req.status is RequestStatus.SWAPPED
                               else req.num_tokens - req.num_cached_tokens)
        if not count:
            return 0, 0
        grow = self._growth(state)
        freed = sum(len(blocks) for _, blocks in output.swapped_out)     # after the copies
        seats = len(state.running) + count - self._max_residents(state.budget)
        return seats, need + grow + self.options.watermark_blocks - bm.num_free_blocks - freed

    def estimated_wait_s(self, req: Request, resident_work_ahead: float, num_served: int,
                         best_key: float) -> float:
        """EWT of a paused resident (Eq. 7): the work ranked ahead of it (residents, and the
        queues above its own, Eq. 6) spread over the batch, or the time aging needs to lift it
        to the head's priority, whichever is sooner."""
        mine = self._keys[req.request_id]
        ahead = resident_work_ahead + self.queues.work_before(self.queues.bucket(mine))
        ewt = ahead / max(1, num_served)
        rate = self.options.aging_rate
        if rate > 0:
            ewt = min(ewt, max(0.0, (mine - best_key) / rate))
        return ewt
