"""EconoServe (SyncDecoupled + KVCPipe + Ordering).

Prompt tasks (PTs) and generation tasks (GTs) wait in separate ordered queues. Each
iteration:

1. active GTs decode one token each inside their exact KV allocation (predicted length plus
   padding, or the calibrated upper quantile); a host first takes back a loan it will need
   (``econo_pipe.py``);
2. GT selection, only when it is due (``sync_groups``: a GT finished, paused or moved, or a GT
   was queued that fits the free KV; the paper schedules a time-synced group once, when a group
   completes): GT groups of equal predicted remainder start together from the GT queue until
   the unreserved KV is allocated, splitting the last group. KV pipelining: by default
   (``lend_scope=pool``, ``econo_pool.py``) GTs write their allocation as they decode and a
   GT starts when every running GT's projected use, to its predicted end plus the buffer,
   leaves it room at every future iteration, so the unwritten tails carry other GTs; with
   ``lend_scope=host`` each started GT lends the unused halves of its own allocation to
   smaller GTs, recursively (``econo_pipe.py``);
3. PTs fill the rest of the token budget: within the reserved KV (``reserved_kv_fraction``,
   whatever prefilled GTs hold), or beyond it when no GT waits and the PT's whole allocation
   fits the unreserved free KV. A finished prefill turns the PT into a queued GT that keeps its
   prompt KV.

Bounded waits. When the head GT (earliest SLO deadline range) does not fit, the free KV is
held for it and a smaller GT starts only if it is predicted to end before the head could
start, or fits in what will be spare then (``econo_backfill.py``). This reservation was chosen
over aging because EconoServe's ordering already ages: a GT's deadline is fixed at arrival, so
every later arrival of the same SLO ranks behind it, and a GT reaches the head within its SLO
window. What starved it was only the best-fit pick that let smaller GTs take the KV as it
freed; the reservation bounds the wait at the head by the running GTs' predicted remainders,
without the head-of-line blocking of a plain reservation. A PT that reached the PT queue's
head is never passed over for blocks (admission stops there) and is chunked rather than passed
over for the token budget.

Under-prediction (offload-free preemption, paper §3.3.2): a GT that outgrows its allocation
first takes free (reserved) blocks; when none are free it pauses, keeping its KV, and is queued
again as a GT with its corrected remainder, ranked by the KV it holds. Only when nothing can
run at all (every block held by waiting tasks) is the lowest-priority queued GT recomputed.
"""
from __future__ import annotations

from services.scheduler.output import Budget, SchedulerOutput
from services.scheduler.policies.econo_backfill import reserve
from services.scheduler.policies.econo_pipe import PipeliningMixin
from services.scheduler.policies.econo_pool import PoolLendingMixin
from services.scheduler.policies.econo_prompts import PromptsMixin
from services.scheduler.policies.econo_queues import OrderedQueue, Ordering
from services.scheduler.policies.econo_sizing import EconoServeConfig, LengthModel, validate
from services.scheduler.policy import Policy
from services.scheduler.request import Prediction, Request, RequestStatus
from services.scheduler.state import SchedulerState

_RUNNING, _SWAPPED = RequestStatus.RUNNING, RequestStatus.SWAPPED
_BACKFILL_STEPS = 64     # size-index steps per selection while the head waits


class EconoServePolicy(PipeliningMixin, PoolLendingMixin, PromptsMixin, Policy):
    name = "econoserve"
    config_class = EconoServeConfig

    def __init__(self, config, policy_config=None):
        super().__init__(config, policy_config)
        o = self.options
        self.reserved_blocks = validate(o, config)
        self.pooled = o.enable_pipelining and o.lend_scope == "pool"   # else per host, halves
        self.waiting_cap = max(1, int(o.waiting_kv_fraction * config.num_gpu_blocks))
        self.model = LengthModel(o, config, self.reserved_blocks)
        self.ordering = Ordering(o.deadline_range_s, o.kv_range_blocks, o.length_range_tokens)
        self.pts = OrderedQueue()            # waiting / preempted: no KV
        self.gts = OrderedQueue()            # prefilled, paused or on the host tier
        self.prefilling: dict[str, Request] = {}
        self.active: dict[str, Request] = {}  # decoding, in activation order
        self.keys: dict[str, tuple] = {}      # priority of every KV holder
        self.lender_of: dict[str, str] = {}           # guest id -> its host's
        self.guests: dict[str, list[Request]] = {}    # host id -> its guests, latest last
        self._bm = None
        self._prof, self._cap = None, 0      # pooled lending: projected GT blocks, their cap
        self._due = True                      # GT selection due this iteration
        self.num_selections = 0               # iterations that ran GT selection
        self.num_pauses = 0                   # offload-free preemptions
        self.num_guest_moves = 0              # guests moved to the host tier
        self.num_hosted = 0                   # GTs started in another's allocation
        self.num_forced = 0                   # waiting GTs recomputed to make room
        self._iteration = 0
        self._promise: tuple[str, int] | None = None   # blocked head, iteration to start by
        self._wake: int | None = None         # a promise falls due: select then

    # -- queues --------------------------------------------------------------------------
    def _key(self, req: Request, occupied: int, length: int) -> tuple:
        return self.ordering.key(self.model.deadline(req), occupied, length)

    def _queue_pt(self, req: Request) -> None:
        # Sized by its uncached tokens: a cached prefix is neither prefilled nor allocated.
        uncached = req.num_tokens - req.num_cached_tokens
        self.pts.push(req, self._key(req, 0, uncached), uncached)

    def _queue_gt(self, req: Request, bm) -> None:
        if req.status is _SWAPPED:       # its KV is on the host tier: all blocks to allocate
            have, occupied = 0, bm.blocks_for(req.num_computed_tokens)
        else:
            have = occupied = bm.num_blocks_of(req.request_id)
        need = max(bm.blocks_for(self.model.target_tokens(req)) - have, 0)
        self.gts.push(req, self._key(req, occupied, self.model.remaining(req)), need)
        if need <= bm.num_free_blocks - self.reserved_blocks:
            self._due = True
        elif self.options.enable_pipelining and self.active:
            self._due = True      # a running host's unused half may take it (KV pipelining)

    def add_request(self, request: Request) -> None:
        self._queue_pt(request)

    def remove_request(self, request: Request) -> None:
        self._unlink(request)
        self.pts.remove(request)
        self._due = True

    def _unlink(self, req: Request) -> None:
        """Forget the request in every table; its guests lose their host (their blocks go
        back to the next lender, or the free pool), its host its loan."""
        rid = req.request_id
        for table in (self.prefilling, self.active, self.keys):
            table.pop(rid, None)
        self.gts.remove(req)
        host = self.lender_of.pop(rid, None)
        if host is not None:
            stack = self.guests.get(host, [])
            if req in stack:
                stack.remove(req)
        for guest in self.guests.pop(rid, ()):
            self.lender_of.pop(guest.request_id, None)

    def on_prediction(self, request: Request, prediction: Prediction) -> None:
        # Re-rank queued tasks; an active GT keeps its allocation (growth handles a miss).
        if self.pts.remove(request):
            self._queue_pt(request)
        elif self._bm is not None and self.gts.remove(request):
            self._queue_gt(request, self._bm)

    def num_queued(self) -> int:
        return len(self.pts) + len(self.gts)

    def counters(self) -> dict[str, float]:
        return {"num_hosted": self.num_hosted, "num_pauses": self.num_pauses,
                "num_guest_moves": self.num_guest_moves, "num_forced": self.num_forced,
                "num_selections": self.num_selections}

    # -- one iteration -------------------------------------------------------------------
    def schedule(self, state: SchedulerState, budget: Budget) -> SchedulerOutput:
        self._bm = state.block_manager
        output = state.new_output()
        self._iteration += 1
        if self._wake is not None and self._iteration >= self._wake:
            self._due, self._wake = True, None
        if self.options.enable_pipelining and self.guests:
            self._reclaim_loans(state, output)
        tokens = self._decode_active(state, output, budget.max_num_batched_tokens)
        tokens = self._continue_prefills(output, tokens)
        if self._due or not self.options.sync_groups:
            self._due = False
            self.num_selections += 1
            if self.pooled:
                self._pool_plan(state.block_manager)
            tokens = self._activate_groups(state, output, tokens)
            if self.options.enable_pipelining and not self.pooled:
                tokens = self._lend_idle_halves(state, output, tokens)
        if not output.scheduled and self.gts:
            tokens = self._force_one_gt(state, output, tokens)
        self._admit_prompts(state, output, tokens)
        return output

    def _decode_active(self, state: SchedulerState, output: SchedulerOutput, tokens: int) -> int:
        for req in list(self.active.values()):
            if tokens <= 0:
                self._due = True          # some GTs got no token: look again next iteration
                break
            if req.status is _RUNNING and self._grow(state, req):
                output.add(req, 1)
                tokens -= 1
        return tokens

    def _grow(self, state: SchedulerState, req: Request) -> bool:
        """Room for the request's next token; False if it paused for lack of KV."""
        allocate, rid = state.block_manager.allocate_slots, req.request_id
        if allocate(rid, req.num_tokens):
            return True
        # Under-provisioned: re-size by the corrected estimate if possible (doubling).
        if allocate(rid, self.model.target_tokens(req)):
            return True
        self._pause(req, state.block_manager)
        return False

    def _pause(self, req: Request, bm) -> None:
        """Offload-free preemption: stop decoding, keep the KV, queue again as a GT."""
        del self.active[req.request_id]
        self.keys.pop(req.request_id, None)
        self.num_pauses += 1
        self._queue_gt(req, bm)
        self._due = True

    def _preempt(self, state: SchedulerState, output: SchedulerOutput, req: Request) -> None:
        self._unlink(req)
        state.preempt(req, output)
        state.cached_tokens(req)
        self._queue_pt(req)

    def _continue_prefills(self, output: SchedulerOutput, tokens: int) -> int:
        for req in self.prefilling.values():
            if tokens <= 0:
                break
            if req.status is _RUNNING:
                n = min(req.num_tokens - req.num_computed_tokens, tokens)
                output.add(req, n)
                tokens -= n
        return tokens

    # -- generation tasks: time-synced groups, the head's reservation ----------------------
    def _free_for_gts(self, bm) -> int:
        return bm.num_free_blocks - self.reserved_blocks

    def _fits(self, req: Request, bm) -> bool:
        if self.pooled:
            return self._pool_slack(req, bm) >= 0
        return self.gts.size_of(req) <= self._free_for_gts(bm)

    def _group(self, req: Request) -> int:
        return self.model.remaining(req) // self.options.group_bucket_tokens

    def _activate_groups(self, state: SchedulerState, output: SchedulerOutput, tokens: int) -> int:
        bm = state.block_manager
        while tokens > 0 and self.gts:
            head = self.gts.head()
            if not self._fits(head, bm):
                if self.pooled:
                    return self._pool_backfill(state, output, head, tokens)
                return self._backfill(state, output, head, tokens)
            group = self._group(head)
            members = [r for r in self.gts.ordered() if self._group(r) == group]
            for req in [head] + [r for r in members if r is not head]:
                if req not in self.gts:
                    continue                              # hosted by an earlier member
                if tokens <= 0 or not self._fits(req, bm):
                    break                                 # split the group: KV is full
                tokens = self._activate(state, output, req, tokens)
        if tokens <= 0 and self.gts:
            self._due = True
        return tokens

    def _releases(self, bm) -> list[tuple[int, int]]:
        """Running GTs' (predicted remainder, blocks back at their end); a host gets its
        loans back first, so it is counted with its whole allocation, a guest with none."""
        return [(self.model.remaining(r),
                 0 if rid in self.lender_of else
                 max(bm.num_blocks_of(rid), bm.blocks_for(self.model.target_tokens(r))))
                for rid, r in self.active.items()]

    def _backfill(self, state: SchedulerState, output: SchedulerOutput, head: Request,
                  tokens: int) -> int:
        """The head does not fit: promise it a start (the shadow of the running GTs'
        releases, fixed when it first waits at the head) and start smaller GTs only where they
        do not delay it. At the promised iteration, waiting GTs that hold the KV it needs
        (prompts prefilled meanwhile) are recomputed to keep the promise."""
        bm, rid, now = state.block_manager, head.request_id, self._iteration
        need = self.gts.size_of(head)
        plan = reserve(need, self._free_for_gts(bm), self._releases(bm))
        if self._promise is None or self._promise[0] != rid:
            # A new head (one that overtook the last keeps the bound of its own deadline).
            self._promise = (rid, now + (plan.shadow or 0))
        promise = self._promise[1]
        if now >= promise:
            if self._evictable(bm, head) >= need - self._free_for_gts(bm):
                self._evict_queued(state, output, head, self._free_for_gts)
                return self._activate(state, output, head, tokens)
            self._wake = now + 1      # running GTs outlive their prediction: look again
            return tokens
        plan.shadow = promise - now if plan.shadow is None else min(plan.shadow, promise - now)
        self._wake = promise if self._wake is None else min(self._wake, promise)
        bound = self._free_for_gts(bm)
        for _ in range(_BACKFILL_STEPS):
            if tokens <= 0 or bound < 0:
                break
            cand = self.gts.largest_fitting(min(bound, self._free_for_gts(bm)))
            if cand is None:
                break
            size, remaining = self.gts.size_of(cand), self.model.remaining(cand)
            if cand is not head and plan.admits(remaining, size):
                plan.take(remaining, size)
                tokens = self._activate(state, output, cand, tokens)
            else:
                bound = size - 1
        return tokens

    def _activate(self, state: SchedulerState, output: SchedulerOutput, req: Request,
                  tokens: int) -> int:
        bm = state.block_manager
        self.gts.remove(req)
        own = 0 if req.status is _SWAPPED else bm.num_blocks_of(req.request_id)
        if req.status is _SWAPPED and not state.swap_in(req, output):
            self._queue_gt(req, bm)
            return tokens
        if self.pooled:
            self._pool_start(req, bm, own)   # written as it decodes: its tail is the pool's
        size = req.num_tokens if self.pooled else self.model.target_tokens(req)
        if not bm.allocate_slots(req.request_id, size):
            self._queue_gt(req, bm)                      # sizes moved under it: retry later
            return tokens
        self._start(req, output)
        tokens -= 1
        if self.options.enable_pipelining and not self.pooled and tokens > 0:
            tokens = self._host(state, output, req, tokens)
        return tokens

    def _start(self, req: Request, output: SchedulerOutput) -> None:
        self.active[req.request_id] = req
        self.keys[req.request_id] = self._key(req, 0, self.model.remaining(req))
        output.add(req, 1)

    def _evictable(self, bm, head: Request) -> int:
        return sum(bm.num_blocks_of(r.request_id) for r in self.gts.ordered()
                   if r is not head and r.status is _RUNNING)

    def _evict_queued(self, state: SchedulerState, output: SchedulerOutput, head: Request,
                      room) -> None:
        """Recompute the lowest-priority waiting GTs holding device KV until ``head``'s
        allocation fits ``room(block_manager)``."""
        bm = state.block_manager
        if self.gts.size_of(head) <= room(bm):
            return
        for victim in reversed(self.gts.ordered()):
            if victim is not head and victim.status is _RUNNING \
                    and bm.num_blocks_of(victim.request_id):
                self.num_forced += 1
                self._preempt(state, output, victim)
                if self.gts.size_of(head) <= room(bm):
                    return

    def _force_one_gt(self, state: SchedulerState, output: SchedulerOutput, tokens: int) -> int:
        """Nothing could run: every block is held by waiting tasks. Recompute the
        lowest-priority GTs holding device KV until the head's allocation fits, then run it."""
        bm, head = state.block_manager, self.gts.head()
        self._evict_queued(state, output, head, lambda b: b.num_free_blocks)
        if self.pooled:
            self._pool_plan(bm)
        if self.gts.size_of(head) > bm.num_free_blocks:
            return tokens                                # prefills hold the rest: they finish
        return self._activate(state, output, head, tokens)

    # -- after the iteration ---------------------------------------------------------------
    def update(self, output: SchedulerOutput, updated: list[Request], result=None) -> None:
        bm = self._bm
        for req in updated:
            rid = req.request_id
            if (req.status is _RUNNING and rid in self.prefilling
                    and req.num_computed_tokens == req.num_tokens - 1):
                del self.prefilling[rid]
                self.keys.pop(rid, None)
                self._queue_gt(req, bm)
        if result is not None:
            decodes = len(self.active)
            self.model.observe(output.num_batched_tokens, decodes, result.timings.total_s)
