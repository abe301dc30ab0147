"""``ssjf``: speculative shortest-job-first (SSJF, Qiu et al. 2024; S3, Jin et al. 2023).

Non-preemptive: the waiting queue is ordered by predicted output length (shortest first);
once admitted a request runs to completion, in admission order, like vLLM. Under memory
pressure the most recently admitted resident is evicted (swapped when a host tier has room,
else recomputed) and resumes before any new request, so a started job keeps its place. A
request with no prediction yet ranks by the running median of finished lengths and is
re-ranked when its prediction arrives.
"""
from __future__ import annotations

import itertools

from services.scheduler.policies.ranked import RankedConfig, RankedPolicy
from services.scheduler.policies.ranked_queue import RankedQueue
from services.scheduler.request import Prediction, Request
from services.scheduler.state import SchedulerState

_RESUME, _NEW = 0, 1     # key classes: evicted requests first, then new ones by length


class SsjfPolicy(RankedPolicy):
    name = "ssjf"
    config_class = RankedConfig

    def __init__(self, config, policy_config=None):
        super().__init__(config, policy_config)
        self.queue = RankedQueue()
        self._order = itertools.count()

    def add_request(self, request: Request) -> None:
        self.queue.push(request, self._key(request))

    def _key(self, request: Request) -> tuple:
        return (_NEW, self.lengths.length_of(request))

    def remove_request(self, request: Request) -> None:
        self.queue.discard(request)

    def num_queued(self) -> int:
        return len(self.queue)

    def on_prediction(self, request: Request, prediction: Prediction) -> None:
        if request in self.queue and request.num_preemptions == 0:
            self.queue.push(request, self._key(request))

    def _rank_residents(self, state: SchedulerState) -> list[Request]:
        return list(state.running.values())      # admission order: nobody is preempted for rank

    def _peek(self, state: SchedulerState) -> Request | None:
        head = self.queue.peek()
        return None if head is None else head[1]

    def _pop(self, request: Request) -> None:
        self.queue.discard(request)

    def _requeue(self, request: Request, state: SchedulerState) -> None:
        self.queue.push(request, (_RESUME, next(self._order)))
