"""``alise-fluid``: ALISE's ordering of who starts, FluidInfer's execution of who has started.

The two designs win on different measures of the same engine (README, "Policies on the real
engine"): ``alise`` cuts normalized latency by running the shortest predicted remaining time
first, and pays in token gaps (a preempted request waits, its stream stalls); ``fluidinfer``
keeps every started request's token gap short by cycling the resident set through the host
tier with a quantum, and pays in normalized latency (it starts requests in arrival order). A
chat user sees both: how soon the answer is done, and whether the stream stalls on its way.

This policy is ``fluidinfer`` with one change: the waiting queue is ranked as ALISE ranks it.
A request that has not started is queued by its estimated remaining time (the predicted
output length, in seconds of the execution-time model of Eq. 3-5 fitted online, ALISE's
``time_model``) minus ``aging_rate`` times its wait, so a long request is not starved. Once it
starts, it is never preempted for rank: it stays in FluidInfer's cycle (its quantum on the
device, then offloaded to the host tier and uploaded again before anyone new starts), so its
token gaps are FluidInfer's. A request evicted by recompute (no host tier, or the tier full)
resumes before any new request, as a started job keeps its place in ``ssjf``.

The choice left open is where ordering applies. Ordering the swapped set too (uploading the
shortest remaining first) would let short late arrivals overtake started long ones again and
again, which is exactly the stalled stream this policy exists to avoid; ordering only the
start keeps the token-gap bound and still lets short requests past long ones in the queue,
where, under load, most of a request's latency is spent. The other combination,
``alise-lb`` (``alise.py``), goes the other way: ALISE's preemptive loop with FluidInfer's
latency bound as a limit on how long a started stream may stall.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

from services.scheduler.policies.fluidinfer import FluidInferConfig, FluidInferPolicy
from services.scheduler.policies.length_stats import LengthDefaults, max_output_len
from services.scheduler.policies.ranked_queue import RankedQueue
from services.scheduler.policies.time_model import ExecutionTimeModel
from services.scheduler.request import Prediction, Request

_RESUME, _NEW = 0, 1     # key classes: evicted requests first, then new ones by remaining time


@dataclass(frozen=True)
class AliseFluidConfig(FluidInferConfig):
    aging_rate: float = 0.1          # priority seconds gained per second waited (0: no aging)
    nominal_token_s: float = 0.02    # seconds per decode step until the time model is fitted
    default_output_len: int = 128    # assumed length of a request with no prediction yet...
    default_from_median: bool = True  # ...until finished requests give a running median


class _RankedWaiting:
    """The slice of ``collections.deque`` that FluidInfer's admission uses, over a ranked heap:
    ``waiting[0]`` is the best queued request, ``appendleft`` queues an evicted one ahead of
    every new one."""

    def __init__(self, key_of):
        self.queue = RankedQueue()
        self._key_of = key_of
        self._resumed = itertools.count()

    def append(self, request: Request) -> None:
        self.queue.push(request, (_NEW, self._key_of(request)))

    def appendleft(self, request: Request) -> None:
        self.queue.push(request, (_RESUME, next(self._resumed)))

    def __getitem__(self, index: int) -> Request:
        head = self.queue.peek() if index == 0 else None
        if head is None:
            raise IndexError("only the head of the waiting queue can be read")
        return head[1]

    def popleft(self) -> Request:
        return self.queue.pop()

    def remove(self, request: Request) -> None:
        if not self.queue.discard(request):
            raise ValueError(f"{request.request_id} is not queued")

    def rerank(self, request: Request) -> None:
        """A new prediction arrived for a queued request that has not started."""
        if request in self.queue:
            self.append(request)

    def __len__(self) -> int:
        return len(self.queue)


class AliseFluidPolicy(FluidInferPolicy):
    name = "alise-fluid"
    config_class = AliseFluidConfig

    def __init__(self, config, policy_config=None):
        super().__init__(config, policy_config)
        o = self.options
        if o.aging_rate < 0 or o.nominal_token_s <= 0 or o.default_output_len < 1:
            raise ValueError(f"{self.name}: need aging_rate >= 0, nominal_token_s > 0 and "
                             "default_output_len >= 1")
        self.model = ExecutionTimeModel(o.nominal_token_s)
        self.lengths = LengthDefaults(o.default_output_len, use_median=o.default_from_median)
        self.waiting = _RankedWaiting(self._key)

    def _key(self, req: Request) -> float:
        """Estimated seconds to finish, less the aging credit it will have earned: as the
        credit grows at the same rate for every queued request, ``remaining + rate *
        arrival`` orders them as ``remaining - rate * waited`` does at any instant."""
        decodes = min(self.lengths.length_of(req), max_output_len(req, self.config.max_model_len))
        remaining = self.model.estimate(req.num_prompt_tokens, req.num_prompt_tokens, decodes)
        return remaining + self.options.aging_rate * req.metrics.arrival_time

    def on_prediction(self, request: Request, prediction: Prediction) -> None:
        if request.num_preemptions == 0 and request.num_computed_tokens == 0:
            self.waiting.rerank(request)

    def update(self, output, updated, result=None) -> None:
        super().update(output, updated, result)
        self.model.observe_iteration(output, result)
        self.lengths.observe_finished(updated)
