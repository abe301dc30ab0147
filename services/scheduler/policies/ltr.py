"""``ltr``: Learning-to-Rank scheduling (Fu et al., "Efficient LLM Scheduling by Learning to
Rank", 2024), non-preemptive.

Requests are admitted in the order of their predicted output length (the rank the paper's
predictor learns; here the length prediction stands in for its score), as in ``ssjf``. The
paper's starvation prevention: a request that has waited longer than ``starvation_s`` is
promoted ahead of every unpromoted request (promoted ones keep arrival order). Finding such
requests must not scan the queue, so queued requests are also kept in a FIFO by the start of
their current wait; only its head is ever examined, O(1) amortised per iteration.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from services.scheduler.policies.ranked import RankedConfig
from services.scheduler.policies.ssjf import SsjfPolicy
from services.scheduler.request import Request
from services.scheduler.state import SchedulerState

_PROMOTED, _RESUME, _NEW = -1, 0, 1


@dataclass(frozen=True)
class LtrConfig(RankedConfig):
    starvation_s: float = 30.0       # a wait longer than this promotes the request


class LtrPolicy(SsjfPolicy):
    name = "ltr"
    config_class = LtrConfig

    def __init__(self, config, policy_config=None):
        super().__init__(config, policy_config)
        if self.options.starvation_s < 0:
            raise ValueError(f"ltr: starvation_s must be >= 0, got {self.options.starvation_s}")
        self._fifo: deque[tuple[float, Request]] = deque()
        self.num_promotions = 0

    def add_request(self, request: Request) -> None:
        super().add_request(request)
        self._fifo.append((request.metrics.arrival_time, request))

    def _requeue(self, request: Request, state: SchedulerState) -> None:
        super()._requeue(request, state)
        self._fifo.append((state.now, request))

    def _peek(self, state: SchedulerState) -> Request | None:
        self._promote_starved(state.now)
        return super()._peek(state)

    def _promote_starved(self, now: float) -> None:
        fifo, limit = self._fifo, self.options.starvation_s
        while fifo and (fifo[0][1] not in self.queue or now - fifo[0][0] > limit):
            since, req = fifo.popleft()
            if req in self.queue:
                self.queue.push(req, (_PROMOTED, since))
                self.num_promotions += 1
