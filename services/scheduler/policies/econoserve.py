"""EconoServe (SyncDecoupled + KVCPipe + Ordering).

Prompt tasks (PTs) and generation tasks (GTs) wait in separate ordered queues. Each
iteration:

1. active GTs decode one token each inside their exact KV allocation (predicted length plus
   padding, or the calibrated upper quantile);
2. when KV is free, GT groups of equal predicted remainder (time-synced: they start together
   and are expected to end together) are activated from the GT queue until the unreserved KV
   is allocated, splitting the last group, then a best fit found by binary search;
3. each newly activated GT may host one smaller GT in the second half of its allocation
   (``BlockManager.lend``), chosen so it ends a safety buffer before the host needs it back;
4. PTs fill the rest of the token budget within the reserved KV (counting every prompt still
   waiting for its GT allocation); beyond it only when no GT waits and the PT's whole
   allocation fits the unreserved free KV. A finished prefill turns the PT into a queued GT
   that keeps its prompt KV.

A GT that outgrows its allocation first takes free (reserved) blocks; when none are free it
preempts by recompute, never by swap: its hosted GT if it has one, else the lowest-priority
idle GT, else the lowest-priority running task (possibly itself).
"""
from __future__ import annotations

from services.scheduler.output import Budget, SchedulerOutput
from services.scheduler.policies.econo_queues import OrderedQueue, Ordering
from services.scheduler.policies.econo_sizing import EconoServeConfig, LengthModel, validate
from services.scheduler.policy import Policy
from services.scheduler.request import Prediction, Request, RequestStatus
from services.scheduler.state import SchedulerState

_RUNNING = RequestStatus.RUNNING


class EconoServePolicy(Policy):
    name = "econoserve"
    config_class = EconoServeConfig

    def __init__(self, config, policy_config=None):
        super().__init__(config, policy_config)
        o = self.options
        self.reserved_blocks = validate(o, config)
        self.model = LengthModel(o, config, self.reserved_blocks)
        self.ordering = Ordering(o.deadline_range_s, o.kv_range_blocks, o.length_range_tokens)
        self.pts = OrderedQueue()            # waiting / preempted: no KV
        self.gts = OrderedQueue()            # prefilled, holding prompt KV, not decoding
        self.prefilling: dict[str, Request] = {}
        self.active: dict[str, Request] = {}  # decoding, in activation order
        self.keys: dict[str, tuple] = {}      # priority of every KV holder (victim choice)
        self.lender_of: dict[str, str] = {}
        self.borrower_of: dict[str, str] = {}
        self._bm = None

    # -- queues --------------------------------------------------------------------------
    def _key(self, req: Request, occupied: int, length: int) -> tuple:
        return self.ordering.key(self.model.deadline(req), occupied, length)

    def _queue_pt(self, req: Request) -> None:
        # Sized by its uncached tokens: a cached prefix is neither prefilled nor allocated.
        uncached = req.num_tokens - req.num_cached_tokens
        self.pts.push(req, self._key(req, 0, uncached), uncached)

    def _queue_gt(self, req: Request, bm) -> None:
        have = bm.num_blocks_of(req.request_id)
        need = max(bm.blocks_for(self.model.target_tokens(req)) - have, 0)
        self.gts.push(req, self._key(req, have, self.model.remaining(req)), need)

    def add_request(self, request: Request) -> None:
        self._queue_pt(request)

    def remove_request(self, request: Request) -> None:
        self._forget(request)
        self.pts.remove(request)

    def _forget(self, req: Request) -> None:
        rid = req.request_id
        for table in (self.prefilling, self.active, self.keys):
            table.pop(rid, None)
        self.gts.remove(req)
        lender = self.lender_of.pop(rid, None)
        if lender is not None:
            self.borrower_of.pop(lender, None)
        borrower = self.borrower_of.pop(rid, None)
        if borrower is not None:
            self.lender_of.pop(borrower, None)

    def on_prediction(self, request: Request, prediction: Prediction) -> None:
        # Re-rank queued tasks; an active GT keeps its allocation (growth handles a miss).
        if self.pts.remove(request):
            self._queue_pt(request)
        elif self._bm is not None and self.gts.remove(request):
            self._queue_gt(request, self._bm)

    def num_queued(self) -> int:
        return len(self.pts) + len(self.gts)

    # -- one iteration -------------------------------------------------------------------
    def schedule(self, state: SchedulerState, budget: Budget) -> SchedulerOutput:
        self._bm = state.block_manager
        output = state.new_output()
        tokens = self._decode_active(state, output, budget.max_num_batched_tokens)
        tokens = self._continue_prefills(output, tokens)
        tokens = self._activate_groups(state, output, tokens)
        if self.options.enable_pipelining:
            tokens = self._lend_idle_halves(state, output, tokens)
        if not output.scheduled and self.gts:
            tokens = self._force_one_gt(state, output, tokens)
        self._admit_prompts(state, output, tokens)
        return output

    def _decode_active(self, state: SchedulerState, output: SchedulerOutput, tokens: int) -> int:
        for req in list(self.active.values()):
            if tokens <= 0:
                break
            if req.status is _RUNNING and self._grow(state, output, req):
                output.add(req, 1)
                tokens -= 1
        return tokens

    def _grow(self, state: SchedulerState, output: SchedulerOutput, req: Request) -> bool:
        """Room for the request's next token; False if it was preempted making it."""
        allocate, rid = state.block_manager.allocate_slots, req.request_id
        need = req.num_computed_tokens + 1
        if allocate(rid, need):
            return True
        # Under-provisioned: re-size by the corrected estimate if possible, else one block.
        if allocate(rid, self.model.target_tokens(req)):
            return True
        while not allocate(rid, need):
            victim = self._victim(req, output)
            self._preempt(state, output, victim)
            if victim is req:
                return False
        return True

    def _victim(self, req: Request, output: SchedulerOutput) -> Request:
        """Its hosted GT (the buffer was not enough), else the lowest-priority idle GT, else
        the lowest-priority task not yet in this batch (possibly ``req`` itself)."""
        taken = {r.request_id for r, _ in output.scheduled}
        borrower = self.borrower_of.get(req.request_id)
        if borrower is not None and borrower in self.active and borrower not in taken:
            return self.active[borrower]
        if self.gts:
            return self.gts.tail()
        holders = [r for r in (*self.active.values(), *self.prefilling.values())
                   if r.status is _RUNNING and r.request_id not in taken]
        return max(holders, key=lambda r: self.keys.get(r.request_id, ()), default=req)

    def _preempt(self, state: SchedulerState, output: SchedulerOutput, req: Request) -> None:
        self._forget(req)
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

    # -- generation tasks: time-synced groups and KV pipelining ----------------------------
    def _free_for_gts(self, state: SchedulerState) -> int:
        return state.block_manager.num_free_blocks - self.reserved_blocks

    def _group(self, req: Request) -> int:
        return self.model.remaining(req) // self.options.group_bucket_tokens

    def _activate_groups(self, state: SchedulerState, output: SchedulerOutput, tokens: int) -> int:
        while tokens > 0 and self.gts:
            free = self._free_for_gts(state)
            head = self.gts.head()
            if self.gts.size_of(head) > free:
                head = self.gts.largest_fitting(free)    # binary search for a best fit
                if head is None:
                    break
            group = self._group(head)
            members = [r for r in self.gts.ordered() if self._group(r) == group]
            for req in [head] + [r for r in members if r is not head]:
                if req not in self.gts:
                    continue                              # hosted by an earlier member
                if tokens <= 0 or self.gts.size_of(req) > self._free_for_gts(state):
                    break                                 # split the group: KV is full
                tokens = self._activate(state, output, req, tokens)
        return tokens

    def _activate(self, state: SchedulerState, output: SchedulerOutput, req: Request,
                  tokens: int) -> int:
        self.gts.remove(req)
        if not state.block_manager.allocate_slots(req.request_id, self.model.target_tokens(req)):
            self._queue_gt(req, state.block_manager)     # sizes moved under it: retry later
            return tokens
        self._start(req, output)
        tokens -= 1
        if self.options.enable_pipelining and tokens > 0:
            tokens = self._host(state, output, req, tokens)
        return tokens

    def _start(self, req: Request, output: SchedulerOutput) -> None:
        self.active[req.request_id] = req
        self.keys[req.request_id] = self._key(req, 0, self.model.remaining(req))
        output.add(req, 1)

    def _host(self, state: SchedulerState, output: SchedulerOutput, host: Request,
              tokens: int) -> int:
        """Lend the second half of the host's fresh allocation to a GT predicted to finish,
        with the safety buffer, before the host writes there."""
        bm, rid = state.block_manager, host.request_id
        remaining = self.model.remaining(host)
        keep = host.num_tokens + -(-remaining // 2)
        spare = bm.num_blocks_of(rid) - bm.blocks_for(keep)
        limit = remaining // 2 - int(self.options.buffer_ratio * remaining)
        guest = self._guest(spare, limit)
        if guest is None:
            return tokens
        need = self.gts.size_of(guest)
        self.gts.remove(guest)
        if need:
            bm.lend(rid, guest.request_id, need, keep)
            self.lender_of[guest.request_id] = rid
            self.borrower_of[rid] = guest.request_id
        self._start(guest, output)
        return tokens - 1

    def _lend_idle_halves(self, state: SchedulerState, output: SchedulerOutput,
                          tokens: int) -> int:
        """GTs still waiting: running hosts that lend nothing now (never did, or their guest
        finished) lend the unused half of what is left of their allocation, as at activation.
        Guests do not re-lend: a loan's blocks go back to their owner."""
        for host in list(self.active.values()):
            if tokens <= 0 or not self.gts:
                break
            rid = host.request_id
            if host.status is _RUNNING and rid not in self.borrower_of \
                    and rid not in self.lender_of:
                tokens = self._host(state, output, host, tokens)
        return tokens

    def _guest(self, spare_blocks: int, limit_tokens: int) -> Request | None:
        """The largest queued GT that fits the lent blocks and is predicted to end within
        ``limit_tokens``. The largest fitting one alone is usually too long (a GT's blocks
        grow with its predicted remainder): step down the size index past each miss."""
        bound = spare_blocks
        while bound > 0 and limit_tokens >= 1:
            guest = self.gts.largest_fitting(bound)
            if guest is None or self.model.remaining(guest) <= limit_tokens:
                return guest
            bound = self.gts.size_of(guest) - 1
        return None

    def _force_one_gt(self, state: SchedulerState, output: SchedulerOutput, tokens: int) -> int:
        """Nothing could run: every block is held by idle GTs. Run the first one on whatever
        is free, recomputing the lowest-priority others if needed, so the queue drains."""
        req = self.gts.head()
        self.gts.remove(req)
        bm = state.block_manager
        while not bm.allocate_slots(req.request_id, req.num_tokens):
            if not self.gts:                 # cannot happen: a lone request always fits
                self._preempt(state, output, req)
                return tokens
            self._preempt(state, output, self.gts.tail())
        bm.allocate_slots(req.request_id, self.model.target_tokens(req))
        self._start(req, output)
        return tokens - 1

    # -- prompt tasks ----------------------------------------------------------------------
    def _admit_prompts(self, state: SchedulerState, output: SchedulerOutput, tokens: int) -> None:
        bm = state.block_manager
        held = self._prompt_kv_held(bm)
        while tokens > 0 and self.pts:
            req = self._pick_prompt(bm, tokens, held, first=not self.prefilling and
                                    not output.scheduled)
            if req is None:
                return
            state.prefix_start(req)             # admit shares its cached prefix
            if not state.admit(req, req.num_tokens):
                return
            self.pts.remove(req)
            held += bm.num_blocks_of(req.request_id)
            # Without chunking an oversized prompt runs whole, alone. A cached prefix was
            # claimed by the admission: only the rest is fed.
            n = req.num_tokens - req.num_computed_tokens
            if self.config.enable_chunked_prefill:
                n = min(n, tokens)
            self.prefilling[req.request_id] = req
            self.keys[req.request_id] = self._key(req, 0, req.num_tokens)
            output.add(req, n)
            tokens -= n

    def _prompt_kv_held(self, bm) -> int:
        """Blocks held for prompts that have no GT allocation yet: prefilling, or prefilled
        and queued as GTs. A block prompts share (a cached prefix) counts once."""
        ids = [*self.prefilling, *(r.request_id for r in self.gts.ordered())]
        if bm.prefix is not None:
            return len({b for rid in ids for b in bm.block_table(rid)})
        return sum(bm.num_blocks_of(rid) for rid in ids)

    def _prompt_fits(self, bm, req: Request, held: int) -> bool:
        """PTs live in the reserve (the paper's "small amount of KVC reserved for adding PTs"),
        counting every prompt still waiting for its GT allocation. Beyond it a prompt starts
        only when no GT waits and its whole allocation fits the unreserved free KV: a prompt
        admitted without room for its GT holds prompt KV that queued GTs need to start, and
        such prompts pile up until decoding stalls."""
        free = bm.num_free_blocks
        # Blocks of its cached prefix that other requests hold already cost nothing new.
        need = bm.blocks_for(req.num_tokens) - bm.num_held_of(bm.match_prefix(req.token_ids))
        if held + need <= min(self.reserved_blocks, held + free):
            return True
        target = bm.blocks_for(self.model.target_tokens(req))
        return not self.gts and target <= free - self.reserved_blocks

    def _pick_prompt(self, bm, tokens: int, held: int, first: bool) -> Request | None:
        head = self.pts.head()
        if head.num_tokens - head.num_cached_tokens <= tokens:
            return head if self._prompt_fits(bm, head, held) else None
        fit = self.pts.largest_fitting(tokens)        # binary search: fill the budget
        if fit is not None:
            return fit if self._prompt_fits(bm, fit, held) else None
        # Only prompts longer than the budget remain: chunk the head rather than stall.
        chunk = self.config.enable_chunked_prefill or first
        return head if chunk and self._prompt_fits(bm, head, held) else None

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
