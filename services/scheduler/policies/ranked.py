"""The shared iteration loop of the ranked policies (alise, oracle, fastserve, ssjf, ltr).

Each iteration merges two ordered streams: the resident requests (RUNNING: KV on the device),
ranked best first by the policy, and the head of the policy's waiting queue (new, preempted
and swapped requests). The better of the two heads is served next while the token budget
lasts. A queued request that outranks a resident may take its seat or blocks (when preemption
is on): the worst-ranked resident not yet served this iteration is evicted, its KV swapped to
the host tier when there is room (else dropped and recomputed later). Residents that are not
served keep their KV on the device, paused, until they are evicted or resume. Work per
iteration is O(running log running + admitted log waiting), never O(waiting).

Swap-outs free their device blocks only once the copy finished (after the iteration), so a
request that needs blocks freed by a swap waits one iteration for them instead of evicting
more. A resident that cannot grow evicts worse residents; if none is left it stays paused
(better-ranked requests hold the memory and will finish or evict it), so the loop cannot
livelock the way self-preemption can.

With ``reserve_decodes`` a prefill chunk (an admission, or a resident still prefilling) leaves
one token of the budget to each resident ranked behind it that this iteration may still run:
otherwise a long prompt that outranks the residents takes the whole budget, iteration after
iteration, and pauses every decode behind it. The rank still decides who is admitted, evicted
and served first; a decode step in a batch costs about what one more prompt token would
(``max_num_batched_tokens`` sizes the iteration), so the chunk is a few percent smaller while
every resident keeps its token. As in paper 001 (whose batch holds the best jobs whole, with no
token budget) and in vLLM (decodes first, prompts in what is left).

With ``reserve_growth`` an admission also leaves free the blocks the residents ranked ahead of
it need for their next step (the rest of a prompt being prefilled, a decode's next block):
taken, they would make a better resident evict the worst one next iteration, often the very
request just admitted or uploaded, which then comes back, round after round, each time
paying two copies on the host link.
"""
from __future__ import annotations

from abc import abstractmethod
from dataclasses import dataclass

from services.scheduler.output import Budget, SchedulerOutput
from services.scheduler.policies.length_stats import LengthDefaults
from services.scheduler.policy import Policy, PolicyConfig
from services.scheduler.request import Request, RequestStatus
from services.scheduler.state import SchedulerState

_RUNNING, _SWAPPED = RequestStatus.RUNNING, RequestStatus.SWAPPED


@dataclass(frozen=True)
class RankedConfig(PolicyConfig):
    preemption: bool = True          # a better queued request may evict a resident
    swap: bool = True                # evicted KV goes to the host tier when it has room
    watermark_blocks: int = 0        # free blocks an admission leaves for residents to grow
    default_output_len: int = 128    # assumed length of a request with no prediction yet...
    default_from_median: bool = True  # ...until finished requests give a running median
    # A prefill chunk leaves one token of the iteration's budget to each resident ranked
    # behind it (see the module docstring); off: the budget goes in rank order.
    reserve_decodes: bool = False
    # An admission leaves free the blocks that the residents ranked ahead of it need next
    # iteration (see the module docstring); off: it may take them, and a resident that then
    # cannot grow evicts the worst-ranked one, often the request just admitted.
    reserve_growth: bool = False


class _Pass:
    """One iteration's progress through the ranked residents."""

    __slots__ = ("ahead", "ahead_need", "deferred", "evicted", "head", "queue_blocked",
                 "ranked", "tail", "tokens")

    def __init__(self, ranked: list[Request], tokens: int):
        self.ranked, self.tokens = ranked, tokens
        self.head, self.tail = 0, len(ranked) - 1
        self.deferred = 0                # device blocks freed by this iteration's swap-outs
        self.evicted: set[str] = set()
        self.queue_blocked = False
        # reserve_growth: blocks the residents ranked[:ahead] need next iteration.
        self.ahead = self.ahead_need = 0

    def behind(self, start: int, limit: int) -> int:
        """Residents from rank ``start`` on that this iteration may still serve, at most
        ``limit`` (the seats left)."""
        n, ranked = 0, self.ranked
        for i in range(start, self.tail + 1):
            if n >= limit:
                break
            if ranked[i].status is _RUNNING:
                n += 1
        return n

    def next_resident(self) -> Request | None:
        ranked = self.ranked
        while self.head < len(ranked) and ranked[self.head].status is not _RUNNING:
            self.head += 1
        return ranked[self.head] if self.head < len(ranked) else None


class RankedPolicy(Policy):
    name = "ranked"
    config_class = RankedConfig

    def __init__(self, config, policy_config=None):
        super().__init__(config, policy_config)
        self._check_fits()
        opts = self.options
        self.lengths = LengthDefaults(opts.default_output_len,
                                      use_median=opts.default_from_median)

    def _check_fits(self) -> None:
        cfg, wm = self.config, self.options.watermark_blocks
        if wm < 0 or self.options.default_output_len < 1:
            raise ValueError(f"{self.name}: watermark_blocks must be >= 0 and "
                             "default_output_len >= 1")
        if cfg.blocks_for(cfg.max_model_len) + wm > cfg.num_gpu_blocks:
            raise ValueError(
                f"{self.name}: watermark_blocks={wm} plus the {cfg.blocks_for(cfg.max_model_len)} "
                f"blocks of one max_model_len request exceed the KV pool of {cfg.num_gpu_blocks} "
                "blocks; lower watermark_blocks or max_model_len")

    # -- what a concrete policy provides -------------------------------------------------------
    @abstractmethod
    def _rank_residents(self, state: SchedulerState) -> list[Request]:
        """Resident requests, best first."""

    @abstractmethod
    def _peek(self, state: SchedulerState) -> Request | None:
        """The best queued request, without removing it."""

    @abstractmethod
    def _pop(self, request: Request) -> None:
        """Remove ``request`` (the last peeked) from the queue: it is being admitted."""

    @abstractmethod
    def _requeue(self, request: Request, state: SchedulerState) -> None:
        """Queue a request just evicted (swapped or preempted)."""

    def _outranks(self, candidate: Request, resident: Request, state: SchedulerState) -> bool:
        """Whether the queued ``candidate`` should run before ``resident``."""
        return False

    def _on_served(self, request: Request, state: SchedulerState) -> None:
        """``request`` got tokens this iteration."""

    def _after_schedule(self, state: SchedulerState, output: SchedulerOutput, p: _Pass) -> None:
        """Hook run once the batch is decided (ALISE's proactive offload)."""

    def _uploads_ahead(self, request: Request) -> bool:
        """Whether a swapped request the ranking admits is uploaded beside the iteration and
        run in the next one (else it runs now, and the iteration waits for its copy)."""
        return False

    def _on_uploaded(self, request: Request) -> None:
        """``request`` was uploaded ahead of the iteration it will run in."""

    def _max_residents(self, budget: Budget) -> int:
        """Requests kept on the device; at most ``max_num_seqs`` of them run per iteration."""
        return budget.max_num_seqs

    # -- the loop ------------------------------------------------------------------------------
    def schedule(self, state: SchedulerState, budget: Budget) -> SchedulerOutput:
        output = state.new_output()
        self._budget_seqs = budget.max_num_seqs
        p = _Pass(self._rank_residents(state), budget.max_num_batched_tokens)
        # One turn per resident per iteration: the hooks and the pass's fields in locals.
        ranked, preemption = p.ranked, self.options.preemption
        peek, outranks, run = self._peek, self._outranks, self._run
        scheduled, max_seqs = output.scheduled, budget.max_num_seqs
        while p.tokens > 0 and len(scheduled) < max_seqs:
            head = p.head       # the next resident still running (_Pass.next_resident)
            while head < len(ranked) and ranked[head].status is not _RUNNING:
                head += 1
            p.head = head
            resident = ranked[head] if head < len(ranked) else None
            cand = None if p.queue_blocked else peek(state)
            if cand is not None and cand.request_id in p.evicted:
                cand, p.queue_blocked = None, True     # no re-admission in the same iteration
            if cand is not None and (resident is None or (
                    preemption and outranks(cand, resident, state))):
                if not self._admit(state, output, p, cand, budget):
                    p.queue_blocked = True
                continue
            if resident is None:
                break
            p.head = head + 1
            run(state, output, p, resident)
        self._after_schedule(state, output, p)
        return output

    def _may_preempt(self, candidate: Request, resident: Request, state: SchedulerState) -> bool:
        return self.options.preemption and self._outranks(candidate, resident, state)

    def _run(self, state: SchedulerState, output: SchedulerOutput, p: _Pass, req: Request) -> None:
        computed = req.num_computed_tokens
        n = len(req.token_ids) - computed
        if n > p.tokens:  # noqa: PLR1730 - a min() call costs more than the rest of the line
            n = p.tokens
        if n > 1 and self.options.reserve_decodes and self.config.enable_chunked_prefill:
            n = min(n, p.tokens - self._reserve(p, p.head, output))   # a prefill chunk
            if n <= 0:
                return
        bm = state.block_manager
        table = bm.tables.get(req.request_id)
        # Most decode steps fit in the blocks the request holds already.
        if table is None or computed + n > len(table) * bm.block_size:
            short = self.config.blocks_for(computed + n) - (len(table) if table else 0)
            while not bm.allocate_slots(req.request_id, computed + n):
                if p.deferred and bm.num_free_blocks + p.deferred >= short:
                    return      # this iteration's swap-outs free enough: paused until then
                victim = self._victim(state, p, req, None)
                if victim is None:
                    return      # stays paused with its KV; see the module docstring
                self._evict(state, output, p, victim)
                # As in vLLM: no admissions in an iteration that evicted for memory.
                p.queue_blocked = True
        output.scheduled.append((req, n))      # output.add, inlined
        output.num_batched_tokens += n
        p.tokens -= n
        self._on_served(req, state)

    def _admit(self, state: SchedulerState, output: SchedulerOutput, p: _Pass, cand: Request,
               budget: Budget) -> bool:
        start = state.prefix_start(cand)
        tokens = p.tokens
        if self.options.reserve_decodes:
            tokens -= self._reserve(p, p.head, output)
        n = self._chunk(cand, start, tokens, output)
        if cand.status is _SWAPPED and self._uploads_ahead(cand):
            n = 1       # room for its next token; it runs next iteration, its KV copied by then
        if n == 0 or not self._make_room(state, output, p, cand, start + n, budget):
            return False
        self._pop(cand)
        if cand.status is _SWAPPED and self._uploads_ahead(cand):
            # Uploaded beside this iteration instead of run in it: the batch does not wait for
            # the copy (Alg. 2 of paper 001); the request resumes from the device next time.
            if not state.swap_in(cand, output):
                raise RuntimeError(f"{self.name}: uploading {cand} failed after room was made")
            self._on_uploaded(cand)
            return True
        bm, total = state.block_manager, start + n
        # _make_room checked the blocks, so neither transition can fail here.
        if cand.status is _SWAPPED:
            ok = state.swap_in(cand, output) and bm.allocate_slots(cand.request_id, total)
        else:
            ok = state.admit(cand, total)
        if not ok:
            raise RuntimeError(f"{self.name}: admitting {cand} failed after room was made")
        output.add(cand, n)
        p.tokens -= n
        self._on_served(cand, state)
        return True

    def _reserve(self, p: _Pass, start: int, output: SchedulerOutput) -> int:
        """Budget tokens a prefill chunk leaves to the residents ranked from ``start`` on."""
        return p.behind(start, self._budget_seqs - len(output.scheduled) - 1)

    def _chunk(self, req: Request, start: int, tokens: int, output: SchedulerOutput) -> int:
        pending = req.num_tokens - start
        if pending <= tokens or self.config.enable_chunked_prefill:
            return max(0, min(pending, tokens))
        # Without chunking a prompt runs whole; an oversized one runs alone.
        return 0 if output.scheduled else pending

    def _make_room(self, state: SchedulerState, output: SchedulerOutput, p: _Pass,
                   cand: Request, end: int, budget: Budget) -> bool:
        while len(state.running) >= self._max_residents(budget):
            victim = self._victim(state, p, cand, cand)
            if victim is None:
                return False
            self._evict(state, output, p, victim)
        bm = state.block_manager
        need = self.config.blocks_for(end) + self.options.watermark_blocks
        if self.options.reserve_growth:
            need += self._growth_ahead(state, p)
        while bm.num_free_blocks < need:
            if bm.num_free_blocks + p.deferred >= need:
                return False        # room arrives when this iteration's swap copies finish
            victim = self._victim(state, p, cand, cand)
            if victim is None:
                return False
            self._evict(state, output, p, victim)
        return True

    def _growth_ahead(self, state: SchedulerState, p: _Pass) -> int:
        """Blocks that the residents ranked ahead of the queue's head (served or paused this
        iteration) still lack for their next step: the rest of a prompt being prefilled, or
        the block a decode fills next. O(1) amortised: the ranks ahead only grow."""
        ranked = p.ranked
        if p.ahead < p.head:
            p.ahead_need += self._blocks_to_grow(state, [r for r in ranked[p.ahead:p.head]
                                                         if r.status is _RUNNING])
            p.ahead = p.head
        return p.ahead_need

    def _blocks_to_grow(self, state: SchedulerState, residents) -> int:
        """Blocks ``residents`` lack for their next step: the rest of a prompt being
        prefilled, or the block a decode fills next."""
        bm, blocks_for, need = state.block_manager, self.config.blocks_for, 0
        for r in residents:
            more = blocks_for(len(r.token_ids) + 1) - bm.num_blocks_of(r.request_id)
            if more > 0:
                need += more
        return need

    def _victim(self, state: SchedulerState, p: _Pass, beneficiary: Request,
                candidate: Request | None) -> Request | None:
        """The worst resident not yet served this iteration, if it may make way."""
        ranked = p.ranked
        while p.tail >= p.head:
            victim = ranked[p.tail]
            if victim.status is not _RUNNING or victim is beneficiary:
                p.tail -= 1
                continue
            if candidate is not None and not self._may_preempt(candidate, victim, state):
                return None
            p.tail -= 1
            return victim
        return None

    def _evict(self, state: SchedulerState, output: SchedulerOutput, p: _Pass,
               victim: Request) -> None:
        blocks = state.block_manager.num_blocks_of(victim.request_id)
        if self._swap_out(state, output, victim):
            p.deferred += blocks
        else:
            state.preempt(victim, output)
        p.evicted.add(victim.request_id)
        self._requeue(victim, state)

    def _swap_out(self, state: SchedulerState, output: SchedulerOutput, victim: Request) -> bool:
        # No host tier: recompute without logging a refusal on every eviction.
        return self.options.swap and state.num_host_blocks > 0 and state.swap_out(victim, output)

    # -- bookkeeping shared by all ranked policies ---------------------------------------------
    def update(self, output, updated, result=None) -> None:
        self.lengths.observe_finished(updated)
