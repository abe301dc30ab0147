"""FluidInfer (report, 2024): no batch size for the non-attention layers, attention in waves.

Every scheduled request's pending tokens go through the token-wise layers in one pass; only
attention, the part that needs KV on the device, runs in waves (``SchedulerOutput.waves``)
packed by ``waves.pack_waves``. Measured trade-offs behind each choice are on
``docs/policies/fluidinfer.md``.

Streamed waves (``stream=auto``, wherever the engine can: an in-process executor and a
full-precision host tier, ``state.can_stream``): a swapped request joins the iteration with
its KV left in the host tier (``state.stream``) and the executor attends over it layer by
layer (``services/executor/streaming.py``). What sizes the iteration, and why:

* **Tokens, by compute** (``token_budget=auto``, ``token_budget.py``): the set is filled up
  to the budget that saturates the token-wise layers, the smallest batch whose seconds per
  token are within ``saturation_tolerance`` of the best the engine reaches up to
  ``max_num_batched_tokens``. The curve is the executor's cost model where it has one (the
  simulator: 498 tokens for OPT-6.7B on four RTX 4090s, the report's "at least 512"; 170 on
  the bundled CPU profile of opt-125m), else the execution-time model fitted online to the
  measured iterations; the configured maximum until either exists. Past it an iteration
  only grows longer; short of it, the fixed cost of reading the weights is shared by fewer
  tokens.
* **Streamed KV, by the link** where copies run beside the compute (a GPU): at most the
  blocks the host link (``stream_mode=link``) or the host CPU's attention (``cpu``) gets
  through within an iteration's compute (a moving average of measured compute seconds),
  since a wave whose upload outlasts its layer stalls the pass. On a CPU executor attention
  reads the host tier in place, and only the token budget bounds the set.
* **Residents and staging, by device KV**: new requests prefill in the device pool; when the
  head of the queue does not fit, the oldest decoding residents are offloaded
  (``max_swaps_per_step``) and go on streamed (Fig. 8). A streamed wave is bounded by
  ``stream_kv_blocks`` (default the pool's block count, one layer of it staged at a time;
  unbounded in place). Streamed requests take turns round robin when a bound leaves some out;
  while any swapped request could not run, nobody new is admitted.
* **Wave order** (§4.2): resident waves first (their KV is there; the first streamed wave's
  upload runs beside them), then streamed waves packed greedily against bubbles of type A
  (prefills of different lengths) and B (decodes beside a prefill): the costliest item opens
  a wave, the bubbles are filled with the costliest items that fit.
* **No concurrent waves.** A wave's sequences go to the attention backend in one varlen
  call, whose work items (per sequence and head) the device runs side by side: that is the
  report's parallel "threads", and the packing decides what shares a call. Running a long
  prefill wave's attention on a second CUDA stream beside the decode waves would overlap
  only the tail of the prefill's grid (one prefill of 512+ tokens already fills the SMs) at
  the cost of a second staging area in device KV, and cannot be measured without a GPU; on
  a CPU the backend's kernels already use every core, so there is nothing to gain.

Any failure to stream (host blocks that cannot grow, a failed copy, a wave larger than the
staging area, ``stream_mode=cpu`` beside a GPU executor) turns streaming off with a logged
reason (``services/scheduler/streams.py``), and the policy cycles the resident set instead:
with a host tier, the longest-resident decodes that have run ``min_resident_steps``
iterations are offloaded while swapped requests are uploaded as blocks free (uploads issued
an iteration ahead where copies overlap compute, ``upload_ahead``); the wave bound is half
the pool where copies overlap compute (one half computes while the other is refilled), else
the whole pool. Without a host tier a request that cannot grow preempts by recompute, as in
vLLM.
"""
from __future__ import annotations

import sys
from collections import deque
from dataclasses import dataclass

from services.scheduler.output import Budget, SchedulerOutput
from services.scheduler.policies.fcfs import FcfsPolicy
from services.scheduler.policies.token_budget import TokenBudget
from services.scheduler.policies.waves import attention_cost, pack_waves
from services.scheduler.policy import PolicyConfig
from services.scheduler.request import Request, RequestStatus
from services.scheduler.state import SchedulerState

_RUNNING = RequestStatus.RUNNING
_AHEAD = {"auto": None, "true": True, "false": False}


@dataclass(frozen=True)
class FluidInferConfig(PolicyConfig):
    # Device KV per attention wave; 0: the pool, or half of it with a host tier whose copies
    # run beside the compute.
    wave_kv_blocks: int = 0
    max_swaps_per_step: int = 4     # requests offloaded (and uploaded) per iteration
    # An upload joins the iteration after the one copying it: "true", "false", or "auto",
    # which uploads ahead only where the KV manager's copies run beside the compute (a GPU's
    # copy engine); on a CPU executor the copy takes the iteration's cores, and the upload
    # only loses its turn.
    upload_ahead: str = "auto"
    # A resident is offloaded for a swapped request only after running this many iterations
    # since it was admitted or uploaded (its quantum). 1 rotates the set as fast as the swap
    # budget allows, so that a small device pool spends most iterations with half its
    # requests in transit; see the module docstring for the measured trade-off.
    min_resident_steps: int = 8
    # Streamed waves (the report's Fig. 7b-8): "auto" runs swapped requests in the iteration
    # with their KV streamed from the host tier wherever the engine can (an in-process
    # executor and full-precision host pool); "false" keeps the resident set cycling above.
    stream: str = "auto"
    # Blocks of one streamed attention wave (one layer of them is staged on the device at a
    # time); 0: the device pool's block count, or unbounded where attention reads the host
    # tier in place (a CPU executor, whose copies do not run beside the compute).
    stream_kv_blocks: int = 0
    # Stream only the KV the host link uploads within an iteration's compute (where copies
    # overlap it); false streams every swapped request the token budget allows.
    stream_link_bound: bool = True
    # Tokens per iteration: "auto" derives the budget that saturates the token-wise layers from
    # the executor's cost model or a time model fitted online (``token_budget.py``); an integer
    # sets it by hand. Never above ``max_num_batched_tokens``.
    token_budget: str = "auto"
    # Where streamed waves' attention runs: "link" (each wave's KV uploaded to the device, the
    # report's Fig. 8), "cpu" (on the host CPU where the KV lives, NEO's way; on a CPU executor
    # both are the same in-place read), "free" (the simulator only: a link that costs nothing).
    stream_mode: str = "link"
    # "auto": the smallest budget whose seconds per token are within this fraction of those
    # at ``max_num_batched_tokens``.
    saturation_tolerance: float = 0.25


class FluidInferPolicy(FcfsPolicy):
    name = "fluidinfer"
    config_class = FluidInferConfig

    def __init__(self, config, policy_config=None):
        super().__init__(config, policy_config)
        o = self.options
        if o.wave_kv_blocks < 0 or o.max_swaps_per_step < 0 or o.min_resident_steps < 1:
            raise ValueError("fluidinfer: wave_kv_blocks and max_swaps_per_step must be >= 0, "
                             "min_resident_steps >= 1")
        if str(o.stream).lower() not in ("auto", "false") or o.stream_kv_blocks < 0:
            raise ValueError(f"fluidinfer: stream must be auto or false and stream_kv_blocks "
                             f">= 0, got {o.stream!r} and {o.stream_kv_blocks}")
        if o.stream_mode not in ("link", "cpu", "free"):
            raise ValueError(f"fluidinfer: stream_mode must be link, cpu or free, got "
                             f"{o.stream_mode!r}")
        if str(o.upload_ahead).lower() not in _AHEAD:
            raise ValueError(f"fluidinfer: upload_ahead must be one of {', '.join(_AHEAD)}, "
                             f"got {o.upload_ahead!r}")
        # None: follow the KV manager (``state.copies_overlap``).
        self._ahead: bool | None = _AHEAD[str(o.upload_ahead).lower()]
        if o.wave_kv_blocks > config.num_gpu_blocks:
            raise ValueError(f"fluidinfer: wave_kv_blocks {o.wave_kv_blocks} exceeds the "
                             f"{config.num_gpu_blocks}-block device pool")
        self.swapped: deque[Request] = deque()
        # Uploaded and not run since: never offloaded or evicted before they run once, else
        # the resident and swapped sets trade places and nothing runs.
        self.fresh: set[str] = set()
        # Iterations run since admission or the last upload, per resident request.
        self.steps_run: dict[str, int] = {}
        self._stuck = False     # a swapped request could neither stream nor come back
        self._compute_s = 0.0   # moving average of an iteration's compute (stalls excluded)
        self.budget = TokenBudget(o.token_budget, o.saturation_tolerance)

    def remove_request(self, request: Request) -> None:
        if request.status is RequestStatus.SWAPPED:
            self.swapped.remove(request)
        self.fresh.discard(request.request_id)
        self.steps_run.pop(request.request_id, None)
        super().remove_request(request)

    def num_queued(self) -> int:
        return len(self.waiting) + len(self.swapped)

    def schedule(self, state: SchedulerState, budget: Budget) -> SchedulerOutput:
        output = state.new_output()
        tokens = self.budget.tokens(state, budget.max_num_batched_tokens)
        if self._streaming(state):
            return self._schedule_streaming(state, output, tokens)
        if state.num_host_blocks and self.swapped:
            self._cycle(state, output)
        tokens = self._schedule_running(state, output, tokens)
        if not output.preempted:
            tokens = self._admit(state, output, tokens)
        output.waves = self._waves(state, output)
        return output

    # -- streamed waves ------------------------------------------------------------------
    def _streaming(self, state: SchedulerState) -> bool:
        return (state.can_stream and bool(state.num_host_blocks)
                and str(self.options.stream).lower() == "auto")

    def _schedule_streaming(self, state: SchedulerState, output: SchedulerOutput,
                            tokens: int) -> SchedulerOutput:
        """Residents first (their KV is on the device), then every swapped request the
        token budget and the host tier allow, streamed; then new requests into the device
        pool, which offloads decoding residents to the host to make room (Fig. 8)."""
        if not self._stuck:
            self._offload_for_admission(state, output)
        tokens = self._schedule_running(state, output, tokens)
        tokens = self._stream(state, output, tokens)
        # A swapped request that could neither stream (the host tier is full) nor come back
        # goes before anyone new, as swapped requests do without streaming.
        if not output.preempted and not self._stuck:
            self.admit_fcfs(state, output, tokens, max_num_seqs=sys.maxsize)
        output.waves = self._stream_waves(state, output)
        return output

    def _stream_bound(self, state: SchedulerState) -> int:
        if self.options.stream_kv_blocks:
            return self.options.stream_kv_blocks
        return self.config.num_gpu_blocks if state.copies_overlap else sys.maxsize

    def _offload_for_admission(self, state: SchedulerState, output: SchedulerOutput) -> None:
        """When the head of the queue does not fit, send the oldest decoding residents to the
        host tier (at most ``max_swaps_per_step``); they go on streamed, and their blocks
        take the new request's prefill from the next iteration."""
        if not self.waiting:
            return
        bm, blocks_for = state.block_manager, self.config.blocks_for
        head = self.waiting[0]
        need = blocks_for(min(head.num_tokens + 1, self.config.max_model_len))
        free = bm.num_free_blocks
        decoding = [r for r in state.running.values()
                    if r.num_computed_tokens >= r.num_prompt_tokens]
        for req in decoding[:self.options.max_swaps_per_step]:
            if free >= need or not state.swap_out(req, output):
                return
            free += blocks_for(req.num_computed_tokens)     # free after the copy
            self.swapped.append(req)
            self.steps_run.pop(req.request_id, None)

    def _stream(self, state: SchedulerState, output: SchedulerOutput, tokens: int) -> int:
        bound, blocks_for = self._stream_bound(state), self.config.blocks_for
        link = self._link_blocks(state)
        self._stuck = False
        for req in list(self.swapped):
            if tokens <= 0:
                break
            n = min(req.num_tokens - req.num_computed_tokens, tokens)
            need = blocks_for(req.num_computed_tokens)
            if (blocks_for(req.num_computed_tokens + n) <= bound and need <= link
                    and state.stream(req, n, output)):
                tokens, link = tokens - n, link - need
                self.swapped.remove(req)        # round robin: streamed go to the back
                self.swapped.append(req)
                continue
            # Too large for one streamed wave, or its KV cannot grow in a full host tier:
            # back onto the device when it fits, else it waits and nobody new starts.
            if self._fits_with_headroom(state, req) and state.swap_in(req, output):
                self.swapped.remove(req)
                self.fresh.add(req.request_id)
            else:
                self._stuck = True
        return tokens

    def _link_blocks(self, state: SchedulerState) -> float:
        """Blocks the host link uploads within one iteration's compute (Fig. 8: copies hide
        behind compute only up to there), where copies overlap it; else no bound."""
        if not (state.copies_overlap and state.stream_blocks_per_s
                and self.options.stream_link_bound):
            return float("inf")
        # Until an iteration was timed, one pool's worth: the first streamed iteration's
        # timing then sizes the next.
        if not self._compute_s:
            return float(self.config.num_gpu_blocks)
        return state.stream_blocks_per_s * self._compute_s

    def update(self, output, updated, result=None) -> None:
        t = result.timings if result is not None else None
        self.budget.observe(output, result)
        if t is not None and t.forward_s > 0:
            compute = max(t.forward_s - t.swap_s, 0.0)
            self._compute_s = compute if not self._compute_s else (
                0.8 * self._compute_s + 0.2 * compute)

    def _stream_waves(self, state: SchedulerState, output: SchedulerOutput):
        """Resident waves as without streaming, then the streamed requests packed greedily
        (``pack_waves``, §4.2) under the streamed-wave bound."""
        if not output.streamed:
            return self._waves(state, output)
        streamed = output.streamed
        res = [i for i, (r, _) in enumerate(output.scheduled) if r.request_id not in streamed]
        out = [i for i, (r, _) in enumerate(output.scheduled) if r.request_id in streamed]
        waves = [[res[j] for j in w] for w in self._pack(state, output, res,
                                                         self._wave_kv_blocks(state))]
        blocks_for = self.config.blocks_for
        costs = [attention_cost(output.scheduled[i][0].num_computed_tokens,
                                output.scheduled[i][1]) for i in out]
        blocks = [blocks_for(output.scheduled[i][0].num_computed_tokens
                             + output.scheduled[i][1]) for i in out]
        bound = min(self._stream_bound(state), sum(blocks))
        return waves + [[out[j] for j in w] for w in pack_waves(costs, blocks, bound)]

    def _pack(self, state, output, idx, bound):
        bm = state.block_manager
        costs = [attention_cost(output.scheduled[i][0].num_computed_tokens,
                                output.scheduled[i][1]) for i in idx]
        return pack_waves(costs, [bm.num_blocks_of(output.scheduled[i][0].request_id)
                                  for i in idx], bound) if idx else []

    def _wave_kv_blocks(self, state: SchedulerState) -> int:
        if self.options.wave_kv_blocks:
            return self.options.wave_kv_blocks
        pool = self.config.num_gpu_blocks
        return max(pool // 2, 1) if state.num_host_blocks and state.copies_overlap else pool

    # -- resident set ------------------------------------------------------------------
    def _cycle(self, state: SchedulerState, output: SchedulerOutput) -> None:
        """Upload swapped requests while blocks are free; when the next one does not fit,
        offload the longest-resident requests instead (they sit out this iteration and their
        blocks, freed after the copy, take the upload of the next)."""
        for _ in range(min(len(self.swapped), self.options.max_swaps_per_step)):
            if not self._fits_with_headroom(state, self.swapped[0]) or not state.swap_in(
                    self.swapped[0], output):
                self._offload(state, output)
                return
            self.fresh.add(self.swapped.popleft().request_id)

    def _fits_with_headroom(self, state: SchedulerState, req: Request) -> bool:
        # An upload must leave the residents room to grow, else one is evicted before the
        # upload has run and the two sets trade places. Room for the blocks they fill over
        # the upload's quantum (its iterations before it may be offloaded again), not a block
        # for each: a resident part-way through its last block needs none, and a block kept
        # free for it is KV that no request computes with.
        bm, steps = state.block_manager, self.options.min_resident_steps
        blocks_for = self.config.blocks_for
        need = blocks_for(req.num_computed_tokens + 1)
        grow = sum(max(0, blocks_for(r.num_tokens + steps - 1) - bm.num_blocks_of(r.request_id))
                   for r in state.running.values())
        return need + grow <= bm.num_free_blocks

    def _offload(self, state: SchedulerState, output: SchedulerOutput) -> None:
        # An upload not yet run has run 0 steps, so the quantum (>= 1) also keeps it.
        quantum, steps = self.options.min_resident_steps, self.steps_run
        resident = [r for r in state.running.values() if steps.get(r.request_id, 0) >= quantum]
        for req in resident[:self.options.max_swaps_per_step]:
            if not state.swap_out(req, output):
                return
            self.swapped.append(req)
            steps.pop(req.request_id, None)

    def _schedule_running(self, state: SchedulerState, output: SchedulerOutput, tokens: int) -> int:
        allocate = state.block_manager.allocate_slots
        # Where copies overlap the compute, requests uploaded this iteration run in the next
        # one and their copies run beside this one.
        upload_ahead = state.copies_overlap if self._ahead is None else self._ahead
        ahead = {rid for rid, _ in output.swapped_in} if upload_ahead else ()
        for req in list(state.running.values()):
            if tokens <= 0:
                break
            if req.status is not _RUNNING or req.request_id in ahead:
                continue
            n = min(req.num_tokens - req.num_computed_tokens, tokens)
            if allocate(req.request_id, req.num_computed_tokens + n) or self._make_room(
                    state, output, req, n):
                output.add(req, n)
                self.fresh.discard(req.request_id)
                self.steps_run[req.request_id] = self.steps_run.get(req.request_id, 0) + 1
                tokens -= n
        return tokens

    def _make_room(self, state: SchedulerState, output: SchedulerOutput, req: Request,
                   n: int) -> bool:
        """Evict the latest-admitted request not yet in the batch: to the host when it has
        room (the request then waits for the copy), else by recompute."""
        allocate = state.block_manager.allocate_slots
        # Never evict a request scheduled or uploaded this iteration: it would come straight
        # back, and the iteration would make no progress.
        taken = {r.request_id for r, _ in output.scheduled} | self.fresh
        while True:
            victim = next((r for r in reversed(state.running.values())
                           if r.request_id not in taken), req)
            self.steps_run.pop(victim.request_id, None)
            if state.num_host_blocks and state.can_swap_out(victim):
                state.swap_out(victim, output)      # its blocks free after the copy
                self.swapped.append(victim)
                return False
            state.preempt(victim, output)
            self.waiting.appendleft(victim)
            if victim is req:
                return False
            if allocate(req.request_id, req.num_computed_tokens + n):
                return True

    def _admit(self, state: SchedulerState, output: SchedulerOutput, tokens: int) -> int:
        # No max_num_seqs: the token budget and free blocks alone bound the resident set;
        # swapped requests come back before anyone new is admitted.
        if self.swapped:
            return tokens
        return self.admit_fcfs(state, output, tokens, max_num_seqs=sys.maxsize)

    # -- attention waves -----------------------------------------------------------------
    def _waves(self, state: SchedulerState, output: SchedulerOutput) -> list[list[int]] | None:
        bm = state.block_manager
        costs = [attention_cost(r.num_computed_tokens, n) for r, n in output.scheduled]
        blocks = [bm.num_blocks_of(r.request_id) for r, _ in output.scheduled]
        waves = pack_waves(costs, blocks, self._wave_kv_blocks(state))
        return waves if len(waves) > 1 else None
