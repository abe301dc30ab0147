"""Placement policies: which live replica takes a request. Each reads the replicas' views
(their last load report plus what this router placed since) and the request's placement
(prompt length, predicted output length); none keeps state beyond a rotation counter.

* ``round-robin`` ignores load: each live replica in turn.
* ``least-loaded``: the fewest unfinished requests (queued + running), as the Gateway API
  Inference Extension's queue-depth scorer and most L7 balancers count load.
* ``length-aware`` (default): the least predicted time to the request's last token: the wait
  for a first token plus the predicted output length times the replica's decode step. A
  replica admits a request when its KV pool has room for the queue ahead and the new prompt;
  it makes room as its requests finish, at a pace set by how many output tokens they are
  still predicted to generate, through its execution-time model. A replica whose requests are
  about to finish frees its pool soon, though it holds as many requests as one serving long
  conversations. Once admitted, each step of the request runs with the replica's batch (its
  execution-time model's per-token and per-request rates), so a long request weighs the batch
  it joins and a short one the wait.
  With prefix affinity (``RouterCore``'s, on unless the spec says ``:no-prefix``), the prompt
  tokens a replica likely holds cached neither wait for room nor need a prefill there.
* ``prefix-affinity``: the replica with the most of the prompt's leading blocks cached (within
  the core's load bound), ties to the fewest unfinished requests: llm-d's and Dynamo's
  overlap-then-load routing, with no length prediction.
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
    uses_prefix = False     # reads ``Placement.cached`` (the core keeps a prefix map for it)

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
    def score(self, replica: ReplicaView, placement: Placement) -> float | tuple:
        """Lower is better."""


class RoundRobin(RouterPolicy):
    name = "round-robin"

    def score(self, replica, placement) -> float:
        return 0.0


class LeastLoaded(RouterPolicy):
    name = "least-loaded"

    def score(self, replica, placement) -> float:
        return replica.num_requests()


class PrefixAffinity(RouterPolicy):
    name = "prefix-affinity"
    uses_prefix = True

    def score(self, replica, placement) -> tuple[int, int]:
        return -placement.cached_on(replica.name), replica.num_requests()


class LengthAware(RouterPolicy):
    name = "length-aware"
    needs_prediction = True
    uses_prefix = True

    def score(self, replica, placement) -> float:
        return predicted_wait_s(replica, placement) + \
            placement.predicted_output_len * decode_step_s(replica, placement)


def predicted_wait_s(replica: ReplicaView, p: Placement) -> float:
    """Seconds until the request's first token on ``replica``: the wait for its KV pool to free
    room for the prompts queued ahead and this one, then their prefill.

    Room frees as requests finish: ``used`` tokens over their mean predicted remaining decode
    steps, each a step of the replica's time model, so ``need`` tokens take ``need * steps *
    beta / used`` seconds. (A first version placed by the sum of predicted remaining work; with
    predictions of realistic error it trailed ``least-loaded`` on simulated A100s.)"""
    t0, _, beta = replica.rates()
    prefill, decode = replica.pending_tokens()
    queued = prefill + p.prompt_tokens - p.cached_on(replica.name)
    free = replica.kv_capacity_tokens() - replica.kv_tokens_used()
    used = max(replica.kv_tokens_used(), 1)
    steps_left = decode / max(replica.num_requests(), 1)
    wait = max(0, queued - free) * steps_left * beta / used
    return wait + t0 * queued


def decode_step_s(replica: ReplicaView, p: Placement) -> float:
    """Seconds per decode step on ``replica`` once the request runs there: the time model's
    alpha per token of KV the step reads and beta per request in the batch (its fixed
    per-iteration part is the same on every replica and left out; 0 until the model is
    fitted). (Placing by the wait alone
    left pools with room tied whatever their batches, so batches drifted apart and per-token
    latency with them: on 16 simulated A100s it trailed ``least-loaded`` under the NL target.)"""
    if replica.load is None or replica.load.rates is None:
        return 0.0      # the prior's beta is a whole step, not a request's share of one
    _, alpha, beta = replica.load.rates
    prefill, _ = replica.pending_tokens()
    context = replica.kv_tokens_used() + prefill + p.prompt_tokens - p.cached_on(replica.name)
    return alpha * context + beta * (replica.num_requests() + 1)


POLICIES = {cls.name: cls for cls in (RoundRobin, LeastLoaded, PrefixAffinity, LengthAware)}
DEFAULT_POLICY = LengthAware.name
NO_PREFIX = ":no-prefix"


def parse_router_spec(spec: str, prefix_affinity: bool = True) -> tuple[str, bool]:
    """``NAME`` or ``NAME:no-prefix`` -> (policy name, prefix affinity on)."""
    if spec.endswith(NO_PREFIX):
        return spec[:-len(NO_PREFIX)], False
    return spec, prefix_affinity


def make_router_policy(name: str) -> RouterPolicy:
    try:
        return POLICIES[name]()
    except KeyError:
        raise ValueError(f"unknown router policy {name!r}; choose from "
                         f"{', '.join(sorted(POLICIES))}") from None
