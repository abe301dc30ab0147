"""vLLM V0's default scheduler (vllm/core/scheduler.py, ``Scheduler._schedule_default``), the
vLLM the EconoServe and ALISE papers compare against.

Three queues: waiting (FCFS), running (admission order) and swapped. Each iteration is
either a prefill batch or a decode batch, never both (prefill-first, no chunked prefill):

1. unless a request is swapped out, waiting prompts are admitted in FCFS order while the
   token budget, ``max_num_seqs`` and the free blocks allow; a prompt needs blocks for all its
   tokens and must leave ``watermark`` of the pool free (vLLM: 1%). The first that does not
   fit stops admission. A prompt larger than the token budget runs whole and alone (vLLM
   requires ``max_num_batched_tokens >= max_model_len`` without chunking);
2. only if no prompt was admitted, the running requests decode one token each, in admission
   order. When a request's next token does not fit in the free blocks (an allocation
   failure), the most recently admitted running request is preempted, repeatedly, until it
   fits or the request has preempted itself;
3. only if nothing was preempted, swapped requests come back (FCFS) while their blocks fit
   with the watermark, and decode in the same iteration.

``preemption_mode`` picks how a victim is preempted. ``recompute`` (the default, as in vLLM
V0 for a request with one sequence: "recomputation by default since it incurs lower overhead
than swapping"; vLLM swaps only beam-search groups) frees its blocks and puts it at the front
of the waiting queue, to be prefilled again with its outputs. ``swap`` moves its KV to the
host tier through the KV manager and appends it to the swapped queue; while any request is
swapped no new prompt is admitted. Where vLLM aborts the engine when the host tier is full,
lenserve recomputes that victim instead. As in vLLM V0 (``Worker.cache_swap`` before the
forward pass, on the compute stream) the iteration waits for its swap copies, so a swap-out's
device blocks serve the same iteration and its copy time is the engine's
(``swap_outs_before_forward``; the EconoServe paper ran vLLM with swapping).
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from services.scheduler.output import Budget, SchedulerOutput
from services.scheduler.policies.fcfs import FcfsPolicy
from services.scheduler.policy import PolicyConfig
from services.scheduler.request import Request, RequestStatus
from services.scheduler.state import SchedulerState

_RUNNING = RequestStatus.RUNNING
_MODES = ("recompute", "swap")


@dataclass(frozen=True)
class VllmV0Config(PolicyConfig):
    preemption_mode: str = "recompute"   # "recompute" | "swap"
    watermark: float = 0.01              # of the pool, left free by admissions (vLLM V0)


class VllmV0Policy(FcfsPolicy):
    name = "vllm-v0"
    config_class = VllmV0Config
    swap_outs_before_forward = True

    def __init__(self, config, policy_config=None):
        super().__init__(config, policy_config)
        o = self.options
        if o.preemption_mode not in _MODES:
            raise ValueError(f"vllm-v0: preemption_mode must be one of {', '.join(_MODES)}, "
                             f"got {o.preemption_mode!r}")
        if not 0.0 <= o.watermark < 1.0:
            raise ValueError("vllm-v0: watermark must be in [0, 1)")
        self.watermark_blocks = int(o.watermark * config.num_gpu_blocks)
        self.swapped: deque[Request] = deque()
        self.num_allocation_failures = 0     # decode steps that found no free block
        self._seen: set[str] = set()          # requests admitted at least once
        self._failed: set[str] = set()        # ... and of those, the ones that met a failure

    def remove_request(self, request: Request) -> None:
        if request.status is RequestStatus.SWAPPED:
            try:
                self.swapped.remove(request)
            except ValueError:
                pass
            return
        super().remove_request(request)

    def num_queued(self) -> int:
        return len(self.waiting) + len(self.swapped)

    def counters(self) -> dict[str, float]:
        """Allocation failures (decode steps that found no free block), and the share of
        admitted requests that met at least one (the paper's "KVC allocation failure
        percentage", 74% for vLLM in its Figure 1d)."""
        return {"num_allocation_failures": self.num_allocation_failures,
                "allocation_failure_share": len(self._failed) / max(len(self._seen), 1)}

    def schedule(self, state: SchedulerState, budget: Budget) -> SchedulerOutput:
        output = state.new_output()
        tokens = budget.max_num_batched_tokens
        if not self.swapped:
            self._prefills(state, output, tokens, budget.max_num_seqs)
        if not output.scheduled:
            tokens = self._decodes(state, output, tokens)
            if not output.preempted and not output.swapped_out:
                self._swap_in(state, output, tokens, budget.max_num_seqs)
        return output

    def _fits(self, state: SchedulerState, blocks: int) -> bool:
        return state.block_manager.num_free_blocks - blocks >= self.watermark_blocks

    def _prefills(self, state: SchedulerState, output: SchedulerOutput, tokens: int,
                  max_num_seqs: int) -> None:
        waiting, running, bm = self.waiting, state.running, state.block_manager
        while waiting and len(running) < max_num_seqs:
            req = waiting[0]
            start = state.prefix_start(req)     # past a cached prefix, if any
            n = req.num_tokens - start
            if n > tokens and output.scheduled:
                break
            have = max(bm.num_blocks_of(req.request_id), start // bm.block_size)
            need = bm.blocks_for(req.num_tokens) - have
            if not self._fits(state, need) or not state.admit(req, req.num_tokens):
                break
            waiting.popleft()
            self._seen.add(req.request_id)
            output.add(req, n)
            tokens -= n

    def _decodes(self, state: SchedulerState, output: SchedulerOutput, tokens: int) -> int:
        bm, running = state.block_manager, state.running
        for req in list(running.values()):
            if tokens <= 0:
                break
            if req.status is not _RUNNING:
                continue                  # preempted by an earlier request of this loop
            need = req.num_tokens
            short = bm.blocks_for(need) - bm.num_blocks_of(req.request_id)
            if short > bm.num_free_blocks:
                self.num_allocation_failures += 1
                self._failed.add(req.request_id)
            while not bm.allocate_slots(req.request_id, need):
                victim = next(reversed(running.values()))
                self._preempt(state, output, victim)
                if victim is req:
                    break
            if req.status is _RUNNING and bm.num_blocks_of(req.request_id) * bm.block_size >= need:
                output.add(req, need - req.num_computed_tokens)
                tokens -= need - req.num_computed_tokens
        return tokens

    def _preempt(self, state: SchedulerState, output: SchedulerOutput, victim: Request) -> None:
        """Preempt ``victim`` by the configured mode."""
        if self.options.preemption_mode == "swap" and state.num_host_blocks > 0:
            if state.swap_out(victim, output):
                self.swapped.append(victim)
                return
        state.preempt(victim, output)
        self.waiting.appendleft(victim)

    def _swap_in(self, state: SchedulerState, output: SchedulerOutput, tokens: int,
                 max_num_seqs: int) -> None:
        bm, swapped = state.block_manager, self.swapped
        while swapped and tokens > 0 and len(state.running) < max_num_seqs:
            req = swapped[0]
            if not self._fits(state, bm.blocks_for(req.num_tokens)):
                break
            if not (state.swap_in(req, output) and bm.allocate_slots(req.request_id,
                                                                       req.num_tokens)):
                raise RuntimeError(f"vllm-v0: swapping {req} in failed after its blocks fit")
            swapped.popleft()
            n = req.num_tokens - req.num_computed_tokens
            output.add(req, n)
            tokens -= n
