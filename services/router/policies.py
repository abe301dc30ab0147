"""Placement policies: which live replica takes a request. Each reads the replicas' views
(their last load report plus what this router placed since) and the request's placement
(prompt length, predicted output length); none keeps state beyond a rotation counter.

* ``round-robin`` ignores load: each live replica in turn.
* ``least-loaded``: the fewest unfinished requests (queued + running), as the Gateway API
  Inference Extension's queue-depth scorer and most L7 balancers count load.
* ``length-aware`` (default): the least predicted work. A replica's work is the tokens its
  unfinished requests still need (prefill, and predicted output still to generate) through
  its execution-time model, plus the new request's own, plus what it would have to wait for
  if its predicted KV footprint overflows the pool: a replica holding a few long
  conversations is loaded though its count is small.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from services.router.core import Placement, ReplicaView


class RouterPolicy(ABC):
    name = "abstract"
    needs_prediction = False

    def __init__(self) -> None:
        self._turn = 0

    def choose(self, replicas: Sequence[ReplicaView], placement: Placement) -> ReplicaView:
        """One of ``replicas`` (never empty): the lowest score, ties broken in rotation so
        that equal replicas share the load."""
        n, start = len(replicas), self._turn
        self._turn += 1
        return min(replicas, key=lambda r: (self.score(r, placement),
                                            (r.index - start) % max(n, 1)))

    @abstractmethod
    def score(self, replica: ReplicaView, placement: Placement) -> float:
        """Lower is better."""


class RoundRobin(RouterPolicy):
    name = "round-robin"

    def score(self, replica, placement) -> float:
        return 0.0


class LeastLoaded(RouterPolicy):
    name = "least-loaded"

    def score(self, replica, placement) -> float:
        return replica.num_requests()


class LengthAware(RouterPolicy):
    name = "length-aware"
    needs_prediction = True

    def score(self, replica, placement) -> float:
        return predicted_work_s(replica, placement)


def predicted_work_s(replica: ReplicaView, p: Placement) -> float:
    """Seconds of the replica's time model: its remaining work, the request's own, and the
    decode time of the tokens its KV pool cannot hold (they wait for blocks to free).

    Remaining decode work is counted at the per-step cost, as if run one at a time: an upper
    bound, but on the same scale on every replica, which is what a placement compares."""
    t0, alpha, beta = replica.rates()
    prefill, decode = replica.pending_tokens()
    backlog = t0 * prefill + beta * decode
    own = t0 * p.prompt_tokens + p.predicted_output_len * (alpha * p.prompt_tokens + beta)
    overflow = replica.kv_tokens_committed() + p.prompt_tokens + p.predicted_output_len \
        - replica.kv_capacity_tokens()
    return backlog + own + beta * max(0, overflow)


POLICIES = {cls.name: cls for cls in (RoundRobin, LeastLoaded, LengthAware)}
DEFAULT_POLICY = LengthAware.name


def make_router_policy(name: str) -> RouterPolicy:
    try:
        return POLICIES[name]()
    except KeyError:
        raise ValueError(f"unknown router policy {name!r}; choose from "
                         f"{', '.join(sorted(POLICIES))}") from None
