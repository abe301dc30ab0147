"""vLLM V1's default scheduler (vllm/v1/core/sched/scheduler.py, ``Scheduler.schedule``).

One FCFS waiting queue. Each step first schedules the running requests in admission order,
each taking as many of its pending tokens as the token budget allows (a chunk of a long
prompt, or one decode token). When a running request's new tokens do not fit in the free
blocks, the most recently admitted running request is preempted by recompute: its blocks are
freed, its computed tokens forgotten, and it returns to the front of the waiting queue; this
repeats until the allocation fits or the request has preempted itself. Only if nothing was
preempted in the step are waiting requests admitted, in arrival order, while the budget,
``max_num_seqs`` and the free blocks allow. Work per step is O(running + admitted).
"""
from __future__ import annotations

from services.scheduler.output import Budget, SchedulerOutput
from services.scheduler.policies.fcfs import FcfsPolicy
from services.scheduler.request import RequestStatus
from services.scheduler.state import SchedulerState

_RUNNING = RequestStatus.RUNNING


class VllmPolicy(FcfsPolicy):
    name = "vllm"

    def schedule(self, state: SchedulerState, budget: Budget) -> SchedulerOutput:
        output = state.new_output()
        tokens = self._schedule_running(state, output, budget.max_num_batched_tokens)
        if not output.preempted:
            self.admit_fcfs(state, output, tokens, budget.max_num_seqs)
        return output

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
