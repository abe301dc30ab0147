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
        # Room the residents need to grow by a token next iteration stays free.
        grow = sum(1 for rid, r in state.running.items()
                   if blocks_for(r.num_tokens + 1) > bm.num_blocks_of(rid))
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
        ahead, running_sum = {}, 0.0      # work ranked ahead of each resident: prefix sums
        for r in p.ranked:
            ahead[r.request_id] = running_sum
            running_sum += self._remaining.get(r.request_id, 0.0)
        best = self._keys[p.ranked[0].request_id]
        for req in paused:
            if req.request_id in self._uploaded:
                continue        # uploaded for the seat it has not had yet: no round trip
            ewt = self.estimated_wait_s(req, ahead[req.request_id], len(served), best)
            if ewt >= self.options.swap_wait_s and state.can_swap_out(req) \
                    and state.swap_out(req, output):
                self._push(req)

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
