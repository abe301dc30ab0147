"""ALISE (paper 001): preemptive, iteration-level shortest-remaining-time scheduling.

* Remaining time: (predicted length - tokens generated) decode steps plus any prefill still
  due, in seconds by the execution-time model of Eq. 3-5 (``time_model.py``), fitted online
  from the executor's measured iteration times; token counts until it is fitted.
* Priority queues bucketed by remaining time, with virtual aging (``alise_queues.py``): every
  second a request waits (queued, or resident but paused) lowers its priority key by
  ``aging_rate`` seconds, and the credit is kept once it runs, so a long request that aged
  past the head is not thrown out again by the next short one. ``worst_wait_s`` is the longest
  single wait seen.
* Demotion: a request that reaches its predicted length gets the prediction doubled (Sec. 3.1)
  and so drops to a lower priority; a prediction 100x too short costs ~7 doublings.
* A request without a prediction is ranked with ``LengthDefaults`` (running median of finished
  lengths) and re-ranked when its prediction arrives (``on_prediction``).
* Hysteresis: a queued request evicts a resident only when better by ``preempt_margin_s``
  plus the victim's recompute time, so two near-equal aging requests do not trade places
  every iteration.
* Preempted KV (Eq. 6-7, Alg. 2): residents that are not served stay on the device; a paused
  resident is offloaded to the host tier ahead of need, worst first, when queued requests
  ranked ahead of it lack seats or blocks for the next iteration (it is beyond the GPU job
  limit M, which memory sets) and its estimated wait EWT reaches ``swap_wait_s``; a resident
  evicted for a better request is swapped, or recomputed when the host tier is full or absent
  (or ``swap=false``).
  EWT = min(work ranked ahead / requests served per iteration, time for aging to lift it to the
  head). The paper sums the work ahead; dividing by the batch accounts for that work running
  concurrently.

* Uploads ahead of need (Alg. 2, lines 5-7): once the batch is decided, the best queued
  requests, as many as the GPU job limit M leaves seats for, whose KV is on the host are
  swapped in while the iteration runs (the copy overlaps it); they resume next iteration from
  the device. A swapped request the ranking admits (it outranks a resident, or a finished
  request freed its blocks) is uploaded the same way instead of run at once, so the batch
  never waits for its copy: it costs that request one iteration, where waiting would stall
  the whole batch for the copy. With ``upload_ahead=false`` (the old path) it runs at once
  and the iteration waits; the engine counts such waits (``num_upload_waits``). A proactive
  upload is skipped when its blocks would leave the residents no room to grow, would take
  the prompt blocks of a better-ranked new request, or when its estimated wait reaches
  ``swap_wait_s`` (it would be offloaded again before it ran).

* Long prompts (``reserve_decodes``, ``reserve_growth``; ``ranked.py``): a prefill chunk leaves
  a token of the budget to each resident ranked behind it, so a long prompt that outranks the
  residents does not pause their decodes (whose EWT then looked long enough to offload them);
  an admission or an upload leaves the residents ranked ahead the blocks of their next step,
  so a swapped request is not brought back into blocks a better prompt's next chunk needs.

* Token-gap bound (``max_gap_s``, off by default; FluidInfer's latency bound, paper 002, as a
  hard limit on ALISE's preemption): a started request whose stream has waited ``max_gap_s``
  for its next token outranks every request that has not, queued or paused, and once it runs
  it keeps its seat for ``gap_quantum`` iterations (FluidInfer's residency quantum), so a long
  request that shorter ones keep displacing still streams, in bursts, instead of stalling
  until they are done.

Queued requests keep the key computed when they were queued; the time model is refitted only
every few iterations and its coefficients settle after warm-up, so the skew is small, and the
model's first fit (the switch from token counts to seconds) re-keys the queue once.
"""
from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass

from services.scheduler.output import SchedulerOutput
from services.scheduler.policies.alise_queues import PriorityQueues
from services.scheduler.policies.alise_swaps import AliseSwaps
from services.scheduler.policies.length_stats import max_output_len
from services.scheduler.policies.ranked import RankedConfig, RankedPolicy
from services.scheduler.policies.time_model import ExecutionTimeModel
from services.scheduler.request import Prediction, Request
from services.scheduler.state import SchedulerState


@dataclass(frozen=True)
class AliseConfig(RankedConfig):
    aging_rate: float = 0.1          # priority seconds gained per second waited (0: no aging)
    num_queues: int = 8
    queue_base_s: float = 1.0        # queue q holds remaining times up to base * 2^q
    swap_wait_s: float = 2.0         # paused residents expected to wait this long are offloaded
    # Alg. 2: the best queued requests within the GPU job limit M whose KV is on the host are
    # uploaded while the iteration runs, so they resume without waiting for the copy...
    upload_ahead: bool = True
    # ...M, jobs kept on the device (0: max_num_seqs); above max_num_seqs, the residents
    # beyond the batch wait on the device, uploaded iterations before they run.
    gpu_job_limit: int = 0
    kv_int8: bool = False            # INT8 for swapped KV (the engine's --kv-int8, one setting)
    nominal_token_s: float = 0.02    # seconds per decode step until the time model is fitted
    demotion: bool = True
    # A queued request evicts a resident only when better by this much plus the victim's
    # recompute time: near-equal requests (both aging) would otherwise swap places every
    # iteration, each switch paying a swap or a recompute.
    preempt_margin_s: float = 0.5
    # A started request that has waited this long for its next token runs before any request
    # that has not (0: off)...
    max_gap_s: float = 0.0
    # ...and keeps its seat for this many iterations once it runs.
    gap_quantum: int = 8
    reserve_decodes: bool = True     # a prefill chunk leaves the residents behind it a token
    reserve_growth: bool = True      # an admission leaves the residents ahead room to grow


# Rank of a stalled or guarded request: ahead of every remaining-time key, oldest wait first.
_URGENT = -1e12


class _Job:
    """ALISE's view of one request."""

    __slots__ = ("length", "since", "waited")

    def __init__(self, length: int, since: float):
        self.length = length             # predicted output length in force
        self.waited = 0.0                # seconds waited in earlier stints
        self.since: float | None = since  # start of the current wait; None while served


class AlisePolicy(AliseSwaps, RankedPolicy):
    name = "alise"
    config_class = AliseConfig

    def __init__(self, config, policy_config=None):
        super().__init__(config, policy_config)
        opts = self.options
        if opts.num_queues < 1 or opts.aging_rate < 0 or opts.queue_base_s <= 0:
            raise ValueError(f"{self.name}: need num_queues >= 1, aging_rate >= 0, "
                             "queue_base_s > 0")
        if opts.gpu_job_limit < 0:
            raise ValueError(f"{self.name}: gpu_job_limit must be >= 0 (0: max_num_seqs)")
        if opts.max_gap_s < 0 or opts.gap_quantum < 1:
            raise ValueError(f"{self.name}: need max_gap_s >= 0 (0: off) and gap_quantum >= 1")
        self.model = ExecutionTimeModel(opts.nominal_token_s)
        self.preempts_by_length = opts.preemption
        self.queues = PriorityQueues(opts.num_queues, opts.queue_base_s)
        self.jobs: dict[str, _Job] = {}
        self._keys: dict[str, float] = {}    # this iteration's resident keys...
        self._remaining: dict[str, float] = {}   # ...and remaining times
        self._was_fitted = False
        self.worst_wait_s = 0.0
        self.num_demotions = 0
        self.now = 0.0
        # max_gap_s: started requests in the queues, oldest wait first (lazy: an entry is live
        # while its request is queued with that wait start), and the guarded residents'
        # iterations left.
        self._stalled: list[tuple[float, int, Request]] = []
        self._stalled_ids = itertools.count()
        self.guarded: dict[str, int] = {}
        self.num_gap_rescues = 0
        self.num_uploads_ahead = 0
        self._uploaded: set[str] = set()    # uploaded ahead, not served since: not offloaded

    # -- estimates -----------------------------------------------------------------------------
    def remaining_s(self, req: Request) -> float:
        job = self.jobs[req.request_id]
        cap = max_output_len(req, self.config.max_model_len)
        decodes = max(1, min(job.length, cap) - req.num_output_tokens)
        # A queued request's cached prefix is not prefilled again: only uncached work counts.
        done = max(req.num_computed_tokens, req.num_cached_tokens)
        prefill = max(0, req.num_tokens - done - 1)
        return self.model.estimate(prefill, req.num_prompt_tokens, decodes)

    def _waited(self, job: _Job, now: float) -> float:
        return job.waited + (now - job.since if job.since is not None else 0.0)

    # -- queue ---------------------------------------------------------------------------------
    def add_request(self, request: Request) -> None:
        self.jobs[request.request_id] = _Job(self.lengths.length_of(request),
                                             request.metrics.arrival_time)
        self._push(request)

    def _push(self, req: Request) -> None:
        job, rate = self.jobs[req.request_id], self.options.aging_rate
        if job.since is None:
            job.since = self.now
        remaining = self.remaining_s(req)
        aged = remaining - rate * self._waited(job, self.now)
        key = remaining - rate * job.waited + rate * job.since
        self.queues.push(req, key, aged, remaining)
        if self.options.max_gap_s and req.num_output_tokens:
            heap = self._stalled
            heapq.heappush(heap, (job.since, next(self._stalled_ids), req))
            if len(heap) > 2 * len(self.queues) + 64:
                # Entries go stale as requests are admitted or re-queued; keep them from
                # outnumbering the queued ones (amortised O(1) per push, as RankedQueue).
                self._stalled = [e for e in heap if self._is_live(e)]
                heapq.heapify(self._stalled)

    def remove_request(self, request: Request) -> None:
        self.queues.discard(request)
        self.jobs.pop(request.request_id, None)
        self.guarded.pop(request.request_id, None)
        self._uploaded.discard(request.request_id)

    def num_queued(self) -> int:
        return len(self.queues)

    def on_prediction(self, request: Request, prediction: Prediction) -> None:
        job = self.jobs.get(request.request_id)
        if job is None:
            return
        job.length = self._settle(request, max(1, int(prediction.length)))
        if request in self.queues:
            self._push(request)          # residents are re-ranked every iteration anyway

    def _settle(self, req: Request, length: int) -> int:
        while length <= req.num_output_tokens:
            length *= 2
        return length

    # -- ranking (RankedPolicy hooks) ----------------------------------------------------------
    def _max_residents(self, budget) -> int:
        return max(self.options.gpu_job_limit, budget.max_num_seqs)

    def schedule(self, state: SchedulerState, budget) -> SchedulerOutput:
        self.now = state.now
        if self.model.fitted and not self._was_fitted:
            self._rekey(state)
        return super().schedule(state, budget)

    def _rekey(self, state: SchedulerState) -> None:
        # Once per engine lifetime: the estimates switch from token counts to seconds.
        self._was_fitted = True
        for req in state.requests.values():
            if req in self.queues:
                self._push(req)

    def _rank_residents(self, state: SchedulerState) -> list[Request]:
        # remaining_s and _waited for every resident, inlined (the same arithmetic in the same
        # order): this runs over the whole batch on every iteration, where a builtin min() or
        # max() call costs ten times the conditional (hence the noqa).
        now, rate, max_len = state.now, self.options.aging_rate, self.config.max_model_len
        t0, alpha, beta = self.model.rates()
        jobs, gap, guarded = self.jobs, self.options.max_gap_s, self.guarded
        self._remaining, self._keys = remaining, keys = {}, {}
        residents, ranks = list(state.running.values()), []
        for req in residents:
            rid, job = req.request_id, jobs[req.request_id]
            prompt_len, num_tokens = req.num_prompt_tokens, len(req.token_ids)
            cap = req.sampling_params.max_tokens
            if max_len - prompt_len < cap:  # noqa: PLR1730
                cap = max_len - prompt_len
            if cap < 1:  # noqa: PLR1730
                cap = 1
            length = job.length if job.length < cap else cap  # noqa: FURB136
            decodes = length - (num_tokens - prompt_len)
            prefill = num_tokens - req.num_computed_tokens - 1
            prefill = prefill if prefill > 0 else 0  # noqa: FURB136
            decodes = decodes if decodes > 1 else 1  # noqa: FURB136
            rem = remaining[rid] = prefill * t0 + decodes * (alpha * prompt_len + beta)
            waited = job.waited + (now - job.since if job.since is not None else 0.0)
            key = keys[rid] = rem - rate * waited
            if gap and (rid in guarded or (job.since is not None and now - job.since >= gap
                                           and num_tokens > prompt_len)):
                key = keys[rid] = _URGENT + (now if job.since is None else job.since)
            ranks.append(key)
        order = sorted(range(len(residents)), key=ranks.__getitem__)
        return [residents[i] for i in order]

    def _peek(self, state: SchedulerState) -> Request | None:
        stalled = self._stalled_head(state.now) if self._stalled else None
        if stalled is not None:
            return stalled
        head = self.queues.head()
        return None if head is None else head[1]

    def _stalled_head(self, now: float) -> Request | None:
        """The queued started request that has waited longest, if that reaches max_gap_s."""
        heap = self._stalled
        while heap:
            since, _, req = heap[0]
            if not self._is_live(heap[0]):
                heapq.heappop(heap)         # admitted, re-queued or gone since
                continue
            return req if now - since >= self.options.max_gap_s else None
        return None

    def _is_live(self, entry: tuple[float, int, Request]) -> bool:
        since, _, req = entry
        job = self.jobs.get(req.request_id)
        return job is not None and job.since == since and req in self.queues

    def _pop(self, request: Request) -> None:
        self.queues.discard(request)

    def _outranks(self, candidate: Request, resident: Request, state: SchedulerState) -> bool:
        if self._stalled and self._stalled_head(state.now) is candidate:
            return self._keys[resident.request_id] > _URGENT / 2
        head = self.queues.head()
        key = head[0] if head is not None and head[1] is candidate else float("inf")
        cost = self.options.preempt_margin_s + self.model.estimate(
            resident.num_computed_tokens, resident.num_prompt_tokens, 0)
        return key - self.options.aging_rate * state.now + cost < self._keys[resident.request_id]

    def _requeue(self, request: Request, state: SchedulerState) -> None:
        state.cached_tokens(request)     # its own blocks likely stayed cached
        self._push(request)

    def _on_served(self, request: Request, state: SchedulerState) -> None:
        job = self.jobs[request.request_id]
        if self._uploaded:
            self._uploaded.discard(request.request_id)
        if self.options.max_gap_s:
            self._guard(request, job, state.now)
        if job.since is not None:
            wait = state.now - job.since
            self.worst_wait_s = max(self.worst_wait_s, wait)
            job.waited += wait
            job.since = None

    def _guard(self, req: Request, job: _Job, now: float) -> None:
        """Count a guarded resident's iterations down; guard a stalled one that runs now."""
        rid = req.request_id
        left = self.guarded.pop(rid, 0) - 1
        if (job.since is not None and req.num_output_tokens
                and now - job.since >= self.options.max_gap_s):
            left = self.options.gap_quantum
            self.num_gap_rescues += 1
        if left > 0:
            self.guarded[rid] = left

    # -- learning ------------------------------------------------------------------------------
    def update(self, output, updated, result=None) -> None:
        super().update(output, updated, result)
        self.model.observe_iteration(output, result)
        if not self.options.demotion:
            return
        jobs = self.jobs
        for req in updated:
            job = jobs.get(req.request_id)
            if (job is not None and len(req.token_ids) - req.num_prompt_tokens >= job.length
                    and not req.is_finished):
                job.length = self._settle(req, job.length * 2)
                self.num_demotions += 1


class OraclePolicy(AlisePolicy):
    """Shortest remaining time with the true output lengths: ALISE's scheduler fed exact
    lengths. Run it with ``predictor=oracle`` (the engine passes ``true_output_len`` to the
    oracle predictor) or with ``predicted_output_len`` set to the true length. With exact
    lengths no request outlives its prediction, so demotion never fires; it stays on so a
    request whose true length was not given degrades to ALISE instead of misbehaving."""

    name = "oracle"


@dataclass(frozen=True)
class AliseBoundConfig(AliseConfig):
    max_gap_s: float = 1.0
    # A rescue's seat is timed in iterations (gap_quantum); an upload that defers a swapped
    # request by one iteration shifts those seats, so alise-lb keeps admit-then-wait.
    upload_ahead: bool = False


class AliseBoundPolicy(AlisePolicy):
    """``alise-lb``: ALISE with FluidInfer's latency bound on (``max_gap_s`` 1 s).

    The bound is a rank, not a reservation: a stalled request is rescued by evicting the
    worst-ranked resident, whose blocks come back after its swap-out, so at overload rescues
    queue behind one another and the P99 token gap lands above ``max_gap_s``. In the simulator
    (opt-125m CPU profile, 300 ShareGPT requests, 64 blocks) a bound of 0.25 or 0.5 s gave a
    P99 gap of 1.68-2.21 s and 1.61-1.79 s at overload, against 1.49-1.75 s with 1 s; hence
    1 s. Tighter token gaps are ``fluidinfer``'s and ``alise-fluid``'s: their
    started requests all run every iteration, cycled through the host tier."""

    name = "alise-lb"
    config_class = AliseBoundConfig
