"""vLLM V1's default scheduler (vllm/v1/core/sched/scheduler.py, ``Scheduler.schedule``).

One FCFS waiting queue. Each step first schedules the running requests in admission order,
each taking as many of its pending tokens as the token budget allows (a chunk of a long
prompt, or one decode token). When a running request's new tokens do not fit in the free
blocks, the most recently admitted running request is preempted by recompute: its blocks are
freed, its computed tokens forgotten, and it returns to the front of the waiting queue; this
repeats until the allocation fits or the request has preempted itself. Only if nothing was
preempted in the step are waiting requests admitted, in arrival order, while the budget,
``max_num_seqs`` and the free blocks allow. Work per step is O(running + admitted).

``prefix_window=W`` (off by default) adds a cache-aware order, SGLang's longest prefix match
bounded so that nothing starves: before admitting, the first ``W`` waiting requests are
ordered by how many of their prompt tokens the device cache holds, most first (ties in queue
order); one that a later request has passed ``W`` times goes first. Work per step grows by a
cache lookup for each of those ``W``.
"""
from __future__ import annotations

import dataclasses

from services.scheduler.output import Budget, SchedulerOutput
from services.scheduler.policies.fcfs import FcfsPolicy
from services.scheduler.policy import PolicyConfig
from services.scheduler.request import RequestStatus
from services.scheduler.state import SchedulerState

_RUNNING = RequestStatus.RUNNING


@dataclasses.dataclass(frozen=True)
class VllmConfig(PolicyConfig):
    prefix_window: int = 0      # cache-aware order over this many waiting requests; 0: off

    def __post_init__(self) -> None:
        if self.prefix_window < 0:
            raise ValueError(f"prefix_window must be >= 0, got {self.prefix_window}")


class VllmPolicy(FcfsPolicy):
    name = "vllm"
    config_class = VllmConfig

    def __init__(self, config, policy_config=None):
        super().__init__(config, policy_config)
        self._passed: dict[str, int] = {}      # request id -> times a later one went first

    def schedule(self, state: SchedulerState, budget: Budget) -> SchedulerOutput:
        output = state.new_output()
        tokens = self._schedule_running(state, output, budget.max_num_batched_tokens)
        if not output.preempted:
            window = self._prefix_order(state) if self.options.prefix_window else None
            self.admit_fcfs(state, output, tokens, budget.max_num_seqs)
            if window:
                self._count_passes(window)
        return output

    def remove_request(self, request) -> None:
        super().remove_request(request)
        self._passed.pop(request.request_id, None)

    def _prefix_order(self, state: SchedulerState) -> list:
        """Put the head of the queue in longest-cached-prefix order; returns it as (queue
        position, request) in that order."""
        w, waiting, passed = self.options.prefix_window, self.waiting, self._passed
        if len(waiting) < 2 or not state.block_manager.prefix:
            return []
        if len(passed) > 4 * w:                 # requests that left some other way
            for rid in [rid for rid in passed if rid not in state.requests]:
                del passed[rid]
        head = [waiting.popleft() for _ in range(min(w, len(waiting)))]

        def rank(item):
            pos, req = item
            if passed.get(req.request_id, 0) >= w:
                return (0, 0, pos)              # passed over too often: first, in queue order
            return (1, -state.cached_tokens(req), pos)

        order = sorted(enumerate(head), key=rank)
        waiting.extendleft(req for _, req in reversed(order))
        return order

    def _count_passes(self, window: list) -> None:
        """Put the window's requests still waiting back in queue order, each that a request
        behind it went ahead of counting one more pass."""
        passed, waiting = self._passed, self.waiting
        last = max((pos for pos, r in window if r.status is _RUNNING), default=-1)
        left = sorted((pos, r) for pos, r in window if r.status is not _RUNNING)
        for _ in left:
            waiting.popleft()
        waiting.extendleft(r for _, r in reversed(left))
        for pos, req in window:
            if req.status is _RUNNING:
                passed.pop(req.request_id, None)
            elif pos < last:
                passed[req.request_id] = passed.get(req.request_id, 0) + 1

    def _schedule_running(self, state: SchedulerState, output: SchedulerOutput, tokens: int) -> int:
        left = self._run_residents(state, output, tokens)
        output.num_batched_tokens += tokens - left
        return left

    def _run_residents(self, state: SchedulerState, output: SchedulerOutput, tokens: int) -> int:
        # Runs for every running request on every iteration: locals, and ``output.add`` and
        # the allocation's common case inlined.
        bm, running, scheduled = state.block_manager, state.running, output.scheduled
        allocate, tables, block_size = bm.allocate_slots, bm.tables, bm.block_size
        evicted = False
        for req in list(running.values()):
            if tokens <= 0:
                break
            if evicted and req.status is not _RUNNING:
                continue    # preempted below by an earlier request of this loop
            computed = req.num_computed_tokens
            n = len(req.token_ids) - computed
            if n > tokens:  # noqa: PLR1730 - a min() call costs more than the rest of the line
                n = tokens
            table = tables.get(req.request_id)
            # Most decode steps fit in the blocks the request holds already.
            if table is None or computed + n > len(table) * block_size:
                while not allocate(req.request_id, computed + n):
                    victim = next(reversed(running.values()))
                    evicted = True
                    state.preempt(victim, output)
                    self.waiting.appendleft(victim)
                    if victim is req:
                        return tokens
            scheduled.append((req, n))
            tokens -= n
        return tokens
