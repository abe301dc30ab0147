"""``fastserve``: skip-join multi-level feedback queue with preemption (FastServe, Wu et al.
2023).

Queue i has quantum ``base_quantum_s * 2^i`` of estimated execution time. A new request skips
the queues whose quantum is shorter than its prefill (a long prompt would use up a short
quantum on its first iteration alone) and joins the first queue whose quantum covers it.
A request that has used its queue's quantum is demoted one queue and starts a fresh quantum.
Higher queues run first and preempt lower ones, iteration by iteration; within a queue the
order is FCFS. Preempted KV is swapped to the host tier when there is one with room, else
dropped and recomputed. A request that waited longer than ``starvation_s`` is promoted to the
top queue, as FastServe's starvation prevention does.

Service is measured with the ALISE execution-time model (Eq. 3-5) fitted online from the
executor's timings, so quanta are in seconds; until it is fitted, token counts scaled by
``nominal_token_s`` stand in.
"""
from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass

from services.scheduler.policies.ranked import RankedConfig, RankedPolicy
from services.scheduler.policies.ranked_queue import RankedQueue
from services.scheduler.policies.time_model import ExecutionTimeModel
from services.scheduler.request import Request
from services.scheduler.state import SchedulerState


@dataclass(frozen=True)
class FastServeConfig(RankedConfig):
    num_queues: int = 6
    base_quantum_s: float = 0.1
    starvation_s: float = 30.0
    nominal_token_s: float = 0.02


class _Job:
    __slots__ = ("attained", "level", "seq", "since")

    def __init__(self, level: int, seq: int, since: float):
        self.level, self.seq, self.since = level, seq, since
        self.attained = 0.0


class FastServePolicy(RankedPolicy):
    name = "fastserve"
    config_class = FastServeConfig

    def __init__(self, config, policy_config=None):
        super().__init__(config, policy_config)
        opts = self.options
        if opts.num_queues < 1 or opts.base_quantum_s <= 0:
            raise ValueError("fastserve: need num_queues >= 1 and base_quantum_s > 0")
        self.model = ExecutionTimeModel(opts.nominal_token_s)
        self.queue = RankedQueue()           # keyed (level, seq): MLFQ order in one heap
        self.jobs: dict[str, _Job] = {}
        self._fifo: deque[tuple[float, Request]] = deque()   # by start of the current wait
        self._seq = itertools.count()
        self.num_promotions = 0

    def quantum_s(self, level: int) -> float:
        return self.options.base_quantum_s * 2 ** level

    def add_request(self, request: Request) -> None:
        prefill = self.model.estimate(request.num_prompt_tokens, request.num_prompt_tokens, 0)
        last = self.options.num_queues - 1
        level = next((i for i in range(last) if self.quantum_s(i) >= prefill), last)
        self.jobs[request.request_id] = _Job(level, next(self._seq), request.metrics.arrival_time)
        self._enqueue(request, request.metrics.arrival_time)

    def _enqueue(self, request: Request, now: float) -> None:
        job = self.jobs[request.request_id]
        job.since = now
        self.queue.push(request, (job.level, job.seq))
        self._fifo.append((now, request))

    def remove_request(self, request: Request) -> None:
        self.queue.discard(request)
        self.jobs.pop(request.request_id, None)

    def num_queued(self) -> int:
        return len(self.queue)

    def _rank_residents(self, state: SchedulerState) -> list[Request]:
        jobs = self.jobs
        return sorted(state.running.values(),
                      key=lambda r: (jobs[r.request_id].level, jobs[r.request_id].seq))

    def _peek(self, state: SchedulerState) -> Request | None:
        self._promote_starved(state.now)
        head = self.queue.peek()
        return None if head is None else head[1]

    def _promote_starved(self, now: float) -> None:
        fifo, jobs = self._fifo, self.jobs
        while fifo:
            since, req = fifo[0]
            job = jobs.get(req.request_id)
            if job is None or req not in self.queue or job.since != since:
                fifo.popleft()           # admitted, finished or queued again since
            elif now - since > self.options.starvation_s:
                fifo.popleft()
                job.level, job.attained = 0, 0.0
                self.queue.push(req, (0, job.seq))
                self.num_promotions += 1
            else:
                return

    def _pop(self, request: Request) -> None:
        self.queue.discard(request)

    def _outranks(self, candidate: Request, resident: Request, state: SchedulerState) -> bool:
        c, r = self.jobs[candidate.request_id], self.jobs[resident.request_id]
        return (c.level, c.seq) < (r.level, r.seq)

    def _requeue(self, request: Request, state: SchedulerState) -> None:
        self._enqueue(request, state.now)

    def update(self, output, updated, result=None) -> None:
        super().update(output, updated, result)
        self.model.observe_iteration(output, result)
        last = self.options.num_queues - 1
        for req, n in output.scheduled:
            job = self.jobs.get(req.request_id)
            if job is None:
                continue                     # finished this iteration
            decode = n == 1 and req.num_output_tokens > 1
            job.attained += self.model.estimate(0 if decode else n, req.num_prompt_tokens,
                                                1 if decode else 0)
            if job.attained >= self.quantum_s(job.level) and job.level < last:
                job.level, job.attained, job.seq = job.level + 1, 0.0, next(self._seq)
