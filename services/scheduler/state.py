"""Request state and the only transitions that change it.

Keeping every transition here, with the block frees and allocations it implies, is what lets
``check_integrity`` hold after any policy's decisions."""
from __future__ import annotations

from collections import Counter

from services.scheduler import prefix_host
from services.scheduler.block_manager import BlockManager
from services.scheduler.config import SchedulerConfig
from services.scheduler.output import Budget, SchedulerOutput
from services.scheduler.request import FinishReason, Request, RequestStatus

_QUEUED = (RequestStatus.WAITING, RequestStatus.PREEMPTED, RequestStatus.SWAPPED)
_ADMITTABLE = (RequestStatus.WAITING, RequestStatus.PREEMPTED)


class SchedulerState:
    """What every policy reads and changes through these methods: the requests, the running
    set (admission order), device block accounting, free host blocks, and the iteration's
    budget (the policy may change it, e.g. FluidInfer lifts the batch size)."""

    def __init__(self, config: SchedulerConfig, num_host_blocks: int = 0,
                 copies_overlap: bool = True):
        self.config = config
        self.block_manager = BlockManager(
            config.num_gpu_blocks, config.block_size,
            enable_prefix_caching=config.enable_prefix_caching,
            cache_namespace=config.cache_namespace)
        # Prompt tokens of admissions that looked the prefix cache up, and those it served.
        self.prefix_query_tokens = 0
        self.prefix_hit_tokens = 0
        self.prefix_host_hit_tokens = 0         # of those, uploaded from the host tier
        self.requests: dict[str, Request] = {}     # unfinished requests only
        # Insertion-ordered: iteration is admission order, popitem() the latest admitted.
        self.running: dict[str, Request] = {}
        self.budget = Budget(config.max_num_batched_tokens, config.max_num_seqs)
        # Free blocks of the host KV tier, as last reported by the KV manager (0: no tier).
        self.num_host_blocks = num_host_blocks
        self.num_free_host_blocks = num_host_blocks
        # Whether the KV manager's copies run beside the iteration (a GPU's copy engine) or
        # take cores it needs (a CPU executor).
        self.copies_overlap = copies_overlap
        # Swap-outs copied before the iteration runs (``Policy.swap_outs_before_forward``):
        # their device blocks are free at once instead of after the iteration.
        self.swap_outs_before_forward = False
        # Host blocks of swap-ins still being copied: free again after the iteration, as the
        # KV manager frees them only once the copy is done.
        self.num_pending_host_blocks = 0
        self.swap_refusals = 0
        # Streaming (FluidInfer): whether the executor and the KV manager can run a request
        # whose KV stays in the host tier (set by the serving core), else why not; and the host
        # blocks reserved this iteration for streamed requests' new KV, by request:
        # (request, computed tokens when reserved, blocks), settled after the iteration.
        self.can_stream = False
        self.stream_off_reason = "no host KV tier"
        self.stream_growth: dict[str, tuple[Request, int, int]] = {}
        # Device blocks per second the host link uploads where copies overlap compute (0: no
        # bound, e.g. a CPU executor reading the host tier in place).
        self.stream_blocks_per_s = 0.0
        # Seconds of the token-wise layers for n decode tokens, where the executor has a cost
        # model (the simulator); None: a policy that needs it fits one online.
        self.token_seconds = None
        self.counts: Counter[RequestStatus] = Counter()
        self.now = 0.0
        self.iteration = 0
        self.num_finished = 0
        self.num_preemptions = 0
        # The prefix cache's host tier (``prefix_host``), sharing the host pool; uploads the
        # policy's picks issued this schedule (owner, device block), and the iteration each
        # request holding pins was last picked.
        self.prefix_host: prefix_host.HostPrefixTier | None = None
        self.prefix_uploads: list[tuple[str, int]] = []
        self.pinned_at: dict[str, int] = {}
        self.num_prefix_upload_waits = 0    # uploads an iteration waited for before it ran
        cap = min(config.prefix_cache_host_blocks, num_host_blocks)
        if cap > 0 and self.block_manager.prefix is not None:
            window = 2 * -(-config.max_num_batched_tokens // config.block_size)
            self.prefix_host = prefix_host.HostPrefixTier(cap, window)
            self.block_manager.prefix.host = self.prefix_host

    def new_output(self) -> SchedulerOutput:
        return SchedulerOutput(iteration=self.iteration)

    def _set_status(self, request: Request, status: RequestStatus) -> None:
        self.counts[request.status] -= 1
        self.counts[status] += 1
        request.status = status

    def add(self, request: Request) -> None:
        self.requests[request.request_id] = request
        self.counts[request.status] += 1

    def cached_tokens(self, request: Request, tiers: bool = False) -> int:
        """Look up, and note on the request, how many of its tokens the prefix cache holds
        now (a policy ranks a queued request by its uncached work): on the device, or with
        ``tiers`` on the device and the host tier (uploaded when the policy picks it)."""
        bm, n = self.block_manager, len(request.token_ids)
        if bm.prefix is None:
            return 0
        if tiers and self.prefix_host is not None and n > bm.block_size:
            found = len(bm.prefix.match_tiers(request.token_ids, (n - 1) // bm.block_size))
        else:
            found = len(bm.match_prefix(request.token_ids))
        request.num_cached_tokens = found * bm.block_size
        return request.num_cached_tokens

    def prefix_start(self, request: Request) -> int:
        """Where the request's next chunk starts if it is admitted now: its computed tokens,
        or for a waiting or preempted request the end of its cached prefix. A policy plans
        the admission's chunk from here (``admit`` then claims that prefix)."""
        computed = request.num_computed_tokens
        bm = self.block_manager
        if computed or bm.prefix is None or request.status not in _ADMITTABLE:
            return computed
        if self.prefix_host is not None:    # picked: its host-cached blocks upload now
            prefix_host.fetch(self, request)
        request.cache_hint = hit = self.cached_tokens(request)
        return hit

    def admit(self, request: Request, num_tokens: int | None = None) -> bool:
        """Admit a waiting or preempted request, first growing its blocks to ``num_tokens``
        (None: the caller already allocated), starting from the cached prefix the policy
        planned with (``prefix_start``). False, and nothing changed, if they do not fit."""
        assert request.status in (RequestStatus.WAITING, RequestStatus.PREEMPTED), request
        rid = request.request_id
        if num_tokens is not None and not self._allocate(request, num_tokens):
            return False
        if self.pinned_at.pop(rid, None) is not None:   # its table holds what it shares
            self.block_manager.pins.release(rid)
        self._set_status(request, RequestStatus.RUNNING)
        self.running[rid] = request
        # Every policy puts what it admits into this iteration's batch, so the first admission
        # is the first scheduling (as in vLLM); set here, not by a pass over every batch.
        metrics = request.metrics
        if metrics.first_scheduled_time is None:
            metrics.first_scheduled_time = self.now
            metrics.num_cached_tokens = request.num_computed_tokens
        return True

    def _allocate(self, request: Request, num_tokens: int) -> bool:
        """Blocks for ``num_tokens``: the planned cached prefix shared, the rest new. Falls
        back to no sharing when the cached blocks would leave too few free ones."""
        bm, rid, hint = self.block_manager, request.request_id, request.cache_hint
        request.cache_hint = 0
        if bm.prefix is None or request.num_computed_tokens or bm.num_blocks_of(rid):
            return bm.allocate_slots(rid, num_tokens)
        blocks = (bm.match_prefix(request.token_ids)[:min(hint, num_tokens) // bm.block_size]
                  if hint else [])
        fits = blocks and (bm.num_free_taken_by(blocks) + bm.blocks_for(num_tokens)
                           - len(blocks) <= bm.num_free_blocks)
        if fits:
            bm.claim_prefix(rid, blocks)
            ok = bm.allocate_slots(rid, num_tokens)
            assert ok, "checked above"
            request.num_computed_tokens = len(blocks) * bm.block_size
        elif not bm.allocate_slots(rid, num_tokens):
            return False
        self.prefix_query_tokens += request.num_tokens
        self.prefix_hit_tokens += request.num_computed_tokens
        return True

    def preempt(self, request: Request, output: SchedulerOutput) -> None:
        """Drop the request's KV; it is recomputed (prompt and outputs so far) when readmitted."""
        self.block_manager.free(request.request_id)
        self.running.pop(request.request_id, None)
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        self.num_preemptions += 1
        self._set_status(request, RequestStatus.PREEMPTED)
        output.preempted.append(request)

    def can_swap_out(self, request: Request) -> bool:
        room = self.num_free_host_blocks + (self.prefix_host.num_evictable()
                                            if self.prefix_host else 0)
        return self.config.blocks_for(request.num_computed_tokens) <= room

    def swap_out(self, request: Request, output: SchedulerOutput) -> bool:
        """Move the request's KV to the host tier; its computed tokens survive. False (and
        the reason in ``output.swap_refusals``) when the host tier cannot take it: the policy
        then keeps it running or preempts it instead."""
        assert request.status is RequestStatus.RUNNING, request
        rid = request.request_id
        # Only blocks holding computed tokens travel; an allocation made ahead (exact
        # allocation for a predicted length) is simply freed.
        need = self.config.blocks_for(request.num_computed_tokens)
        short = need - self.num_free_host_blocks
        if short > 0 and not prefix_host.evict(self, short, output):   # swaps come first
            self.swap_refusals += 1
            output.swap_refusals.append((rid, f"host KV pool has {self.num_free_host_blocks} "
                                              f"free blocks, {need} needed"))
            return False
        blocks = self.block_manager.free(rid, defer=not self.swap_outs_before_forward)
        self.num_free_host_blocks -= need
        self.running.pop(rid, None)
        request.num_preemptions += 1
        self.num_preemptions += 1
        self._set_status(request, RequestStatus.SWAPPED)
        output.swapped_out.append((rid, list(blocks[:need])))
        output.swap_sequence.append((True, rid, list(blocks[:need])))
        return True

    def swap_in(self, request: Request, output: SchedulerOutput) -> bool:
        """Bring a swapped request back onto the device, if its blocks fit."""
        assert request.status is RequestStatus.SWAPPED, request
        rid = request.request_id
        if not self.block_manager.allocate_slots(rid, request.num_computed_tokens):
            return False
        self.num_pending_host_blocks += self.config.blocks_for(request.num_computed_tokens)
        self._set_status(request, RequestStatus.RUNNING)
        self.running[rid] = request
        table = list(self.block_manager.block_table(rid))
        output.swapped_in.append((rid, table))
        output.swap_sequence.append((False, rid, table))
        return True

    def stream(self, request: Request, num_tokens: int, output: SchedulerOutput) -> bool:
        """Schedule ``num_tokens`` of a swapped request whose KV stays in the host tier,
        reserving the host blocks its new KV needs. False (nothing changed) if they do not fit."""
        assert request.status is RequestStatus.SWAPPED and self.can_stream, request
        blocks_for, computed = self.config.blocks_for, request.num_computed_tokens
        grow = blocks_for(computed + num_tokens) - blocks_for(computed)
        if grow > self.num_free_host_blocks:
            return False
        self.num_free_host_blocks -= grow
        if grow:
            self.stream_growth[request.request_id] = (request, computed, grow)
        output.add(request, num_tokens)
        output.streamed.add(request.request_id)
        return True

    def settle_streams(self) -> None:
        """After the iteration: a streamed request that advanced holds its new host blocks
        (counted from its computed tokens from now on); one that did not (a failed or dropped
        iteration) gives them back."""
        for request, computed, grow in self.stream_growth.values():
            if request.num_computed_tokens == computed:
                self.num_free_host_blocks += grow
        self.stream_growth.clear()

    def release_swapped(self, in_flight: int = 0) -> None:
        """The iteration's copies are done: swap-outs' device blocks and swap-ins' host blocks
        may be handed out again, but for ``in_flight`` host blocks that swap-ins still in
        flight (uploads ahead of need, landing in the background) read."""
        self.block_manager.release_deferred()
        assert 0 <= in_flight <= self.num_pending_host_blocks, (in_flight,
                                                                 self.num_pending_host_blocks)
        self.num_free_host_blocks += self.num_pending_host_blocks - in_flight
        self.num_pending_host_blocks = in_flight
        if self.prefix_host is not None:     # abandoned write-backs' host blocks are freed
            self.num_free_host_blocks += self.prefix_host.settle()

    def prefix_writeback_failed(self, owner: str) -> None:
        """A write-back's copy failed: the manager dropped its host block."""
        if self.prefix_host.drop_owner(owner):
            self.num_free_host_blocks += 1

    def prefix_upload_failed(self, block: int) -> None:
        """An upload into ``block`` failed: its KV is garbage, never to be served."""
        self.block_manager.pins.drop_block(block)
        self.block_manager.prefix.drop(block)

    def finish(self, request: Request, reason: FinishReason) -> None:
        # Finished requests leave the tracked set, so they drop out of the status counts.
        # One picked but not admitted holds pins only: its uploads land as free cached blocks.
        if self.pinned_at.pop(request.request_id, None) is not None:
            self.block_manager.pins.release(request.request_id)
        self.block_manager.free(request.request_id)
        self.running.pop(request.request_id, None)
        if request.status is RequestStatus.SWAPPED:
            self.num_free_host_blocks += self.config.blocks_for(request.num_computed_tokens)
        self.counts[request.status] -= 1
        request.status = reason.status
        request.finish_reason = reason
        request.metrics.finished_time = self.now
        del self.requests[request.request_id]
        self.num_finished += 1

    def num_queued(self) -> int:
        return sum(self.counts[s] for s in _QUEUED)

    def check_integrity(self) -> None:
        """Block accounting agrees with request state. Raises AssertionError if not."""
        bm = self.block_manager
        bm.check_integrity()
        for rid, req in self.requests.items():
            held = bm.num_blocks_of(rid)
            if req.status is RequestStatus.RUNNING:
                assert held * bm.block_size >= req.num_computed_tokens, f"{req} lost KV blocks"
            else:
                assert held == 0, f"{req} holds {held} device blocks while {req.status.value}"
            if req.status is RequestStatus.PREEMPTED:
                assert req.num_computed_tokens == 0, f"{req} preempted with computed tokens"
            assert req.num_computed_tokens <= req.num_tokens, f"{req} computed past its tokens"
        assert bm.owners() <= set(self.requests), f"blocks held by gone {bm.owners() - set(self.requests)}"
        running = {rid for rid, r in self.requests.items() if r.status is RequestStatus.RUNNING}
        assert set(self.running) == running, f"running set {set(self.running) ^ running} off"
        held = sum(self.config.blocks_for(r.num_computed_tokens) for r in self.requests.values()
                   if r.status is RequestStatus.SWAPPED)
        free, pending = self.num_free_host_blocks, self.num_pending_host_blocks
        if self.prefix_host is not None:
            pending += len(self.prefix_host) + len(self.prefix_host.abandoned)
        pending += sum(grow for _, _, grow in self.stream_growth.values())
        assert held + free + pending == self.num_host_blocks, (
            f"host blocks: {held} held + {free} free + {pending} pending or prefix-cached "
            f"!= {self.num_host_blocks}")
        pinned = set(self.block_manager.pins.of)
        assert pinned <= set(self.pinned_at) <= set(self.requests), "pins of a gone request"
        assert all(self.requests[r].status in _ADMITTABLE for r in pinned), "pins of a runner"
        live = Counter(r.status for r in self.requests.values())
        assert +self.counts == +live, f"status counts {dict(self.counts)} != {dict(live)}"
