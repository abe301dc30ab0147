"""Placement policies: which live replica takes a request. Each reads the replicas' views
(their last load report plus what this router placed since) and the request's placement
(prompt length, predicted output length); none keeps state beyond a rotation counter.

* ``round-robin`` ignores load: each live replica in turn.
* ``least-loaded``: the fewest unfinished requests (queued + running), as the Gateway API
  Inference Extension's queue-depth scorer and most L7 balancers count load.
* ``length-aware`` (default): the least KV the replica is projected to hold a few decode steps
  ahead, as a share of its pool, counting the new prompt: its running requests each grow a
  token a step, and those predicted to finish within the horizon give theirs back (the mean
  predicted remaining output of its requests sets what share survives). A replica near its
  pool's end queues new prompts and preempts running requests, which is what sets the P99
  time to first token and much of the normalized latency near capacity; one whose requests
  are about to finish frees its pool soon, though it holds as many requests, or as much KV,
  as one serving long conversations. Placements since the last report count at once (their
  prompts and predicted outputs), so a burst between reports spreads instead of herding.
  With prefix affinity (``RouterCore``'s, on unless the spec says ``:no-prefix``), the prompt
  tokens a replica likely holds cached need no new KV there. Among the replicas within
  ``band`` of the lowest projected share, the one with most of the prompt cached, then the
  one where the request adds the least normalized latency by the replica's time model: the
  decode step of the batch it joins and its wait for a first token over its predicted
  output, plus what its step adds to the requests there for as long as it overlaps them,
  read from their predicted remaining outputs. A replica whose
  policy preempts by predicted length (``alise``) is always within the band.
* ``prefix-affinity``: the replica with the most of the prompt's leading blocks cached (within
  the core's load bound), ties to the fewest unfinished requests: llm-d's and Dynamo's
  overlap-then-load routing, with no length prediction.
"""
from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import TYPE_CHECKING

from services.router.residents import overlap_one

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
        turn = self._rotation(replicas)
        return min(replicas, key=lambda r: (self.score(r, placement), turn(r)))

    def _rotation(self, replicas: Sequence[ReplicaView]):
        """The last tie-break of one choice: each replica's distance from this turn's start,
        so that equal replicas take turns."""
        n, start = max(len(replicas), 1), self._turn
        self._turn += 1
        return lambda r: (r.index - start) % n

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

    def __init__(self, horizon_steps: int = 16, band: float = 0.1) -> None:
        super().__init__()
        self.horizon_steps, self.band = horizon_steps, band

    def choose(self, replicas: Sequence[ReplicaView], placement: Placement) -> ReplicaView:
        """The pools projected to hold the least KV (within ``band`` of the lowest share), then
        among them the one likely to hold most of the prompt cached (prefix affinity), then
        the least normalized latency the request adds (``marginal_nl``), ties in rotation.
        A replica whose policy lets a shorter request preempt (``preempts_by_length``) is
        always within the band: a request's wait there does not follow the pool's fill.

        Why two stages: the projected share alone (the old score) set the lead in P99 time
        to first token, but it balances KV, not requests, and a step's time grows with the
        requests in it (``beta``, and the fixed cost ``c`` the rates fold in, per request):
        every request on a replica pays its step, so the normalized latency, a mean over
        requests, pays for the spread of their counts. In the simulator (Llama-2-7B on
        A100s, ShareGPT, ``alise`` inside, seed 0) the share alone spread the replicas'
        unfinished requests with a coefficient of variation of 0.15-0.16 at 16 replicas
        against ``least-loaded``'s 0.02; a band of 0.1 halved the spread. A band of 0.2
        lost the TTFT lead at 8 replicas; 0.02 and 0.05 kept less of the NL gain.

        Why the band does not hold a preempting replica: with ``alise`` inside and the band
        over every replica, ``length-aware`` trailed ``least-loaded`` under the NL target
        on all four runs (8 and 16 replicas, two seeds: 91.3 against 91.8 req/s, 94.8 / 95.6,
        201.9 / 206.9, 211.1 / 212.7); a share counting only the KV of requests predicted
        shorter (those a new request cannot preempt) kept it behind (91.2, 94.9, 201.6,
        211.4) though it led P99 TTFT by 2-9%. Without the band the marginal NL decides: it
        leads on all four runs, under NL by 0.2-1.3% and under P99 TTFT by 0.2-2.7%
        (``docs/results/router.md``)."""
        turn = self._rotation(replicas)
        shares = [self.score(r, placement) for r in replicas]
        free = [self.always_within(r) for r in replicas]
        bound = min((s for s, f in zip(shares, free) if not f), default=0.0) + self.band
        best = min((i for i in range(len(replicas)) if free[i] or shares[i] <= bound),
                   key=lambda i: (-placement.cached_on(replicas[i].name),
                                  self.within_band(replicas[i], placement, shares[i]),
                                  shares[i], turn(replicas[i])))
        return replicas[best]

    def always_within(self, replica: ReplicaView) -> bool:
        """Whether the replica is within the band whatever its share (it preempts by length)."""
        return replica.preempts_by_length()

    def within_band(self, replica: ReplicaView, placement: Placement, share: float) -> float:
        """The key among the pools the band keeps, after the cached prompt."""
        return marginal_nl(replica, placement, share)

    def score(self, replica, placement) -> float:
        return projected_kv_share(replica, placement, self.horizon_steps)


def marginal_nl(replica: ReplicaView, p: Placement, share: float) -> float:
    """The normalized latency (s/token) the request adds on ``replica``: its own, about the
    step of the batch it joins (``step_time_s``) plus its wait (``wait_s``) over its
    predicted output, and what its step adds to each request there for as long as they
    overlap (``residents``: ``beta`` for one more request, ``alpha`` a token for its KV, its
    prompt and half its predicted output on average). Neither ``least-loaded``'s count nor
    a pool's fill says which replica's requests end soon; their predicted remaining outputs
    do."""
    _, alpha, beta = replica.rates()
    length = max(p.predicted_output_len, 1)
    overlap = replica.remaining().overlap(length) + sum(
        overlap_one(decode, length) for _, decode in replica.since.values())
    kv = p.prompt_tokens - p.cached_on(replica.name) + length / 2
    step = step_time_s(replica, share)
    return step + wait_s(replica, p, share, step) / length + (beta + alpha * kv) * overlap


def wait_s(replica: ReplicaView, p: Placement, share: float, step: float) -> float:
    """The request's wait for its first token on ``replica``: its prompt's prefill (``T0``
    a token not cached), and on a replica that serves in arrival order the prompts queued
    ahead of it, and, where its pool is projected past full, the steps until the excess
    frees: requests finish at one in their mean predicted remaining output a step, each
    giving back its share of the pool, so ``(share - 1)`` times that mean. A replica that
    preempts by predicted length makes room for a shorter request at once.

    In the simulator (8 and 16 A100s, ``vllm`` inside, two seeds) this term took
    ``length-aware``'s lead over ``least-loaded`` under NL <= 0.025 from -0.3%..+1.1% to
    +1.5%..+2.5%, and under P99 TTFT <= 1 s from +2.3%..+5.5% to +2.9%..+5.9%."""
    t0 = replica.rates()[0]
    own = t0 * (p.prompt_tokens - p.cached_on(replica.name))
    if replica.preempts_by_length():
        return own
    prefill, decode = replica.pending_tokens()
    mean_remaining = max(decode / max(replica.num_requests(), 1), 1.0)
    return own + t0 * prefill + max(0.0, share - 1.0) * mean_remaining * step


def step_time_s(replica: ReplicaView, share: float) -> float:
    """One decode step of ``replica``'s batch with one more request, by its time model: the
    KV it reads (the projected share of the pool) at ``alpha`` a token, and ``beta + c`` a
    request (the rates the replica reports once fitted; the scheduler's prior, a count of
    requests, before)."""
    _, alpha, beta = replica.rates()
    return alpha * share * replica.kv_capacity_tokens() + beta * (replica.num_requests() + 1)


def projected_kv_share(replica: ReplicaView, p: Placement, horizon_steps: int = 16) -> float:
    """The share of ``replica``'s KV pool projected to be held ``horizon_steps`` decode steps
    from now with the request placed there: the tokens held now and a token a step for each
    unfinished request, times the share of requests still running then, plus the prompts
    queued (reported and placed since) and this one.

    The report gives only sums, so the requests' remaining outputs are taken as exponential
    with the mean of their predictions (``remaining_decode_tokens`` over the requests), the
    shape of ShareGPT's outputs: ``exp(-horizon / mean)`` of them still run then. In the
    simulator (A100s, Llama-2-7B, ShareGPT, log-normal prediction error sigma 0.7) the pool's
    fill set most of the gain over ``least-loaded``; without the placements since the last
    report most of it was lost; a horizon of 16 steps (a few reports' worth) did better than
    none, 32 or 64 on most runs tried; adding a count of requests made it worse; a sum of
    predicted remaining work, or a wait plus decode time through each replica's fitted time
    model, trailed ``least-loaded`` on P99 TTFT as the whole score (``LengthAware`` uses the
    time model only among the pools this share ranks alike). Pure arithmetic on the report: a few
    microseconds a replica."""
    load = replica.load
    if load is None:
        prefill, decode = replica.pending_tokens()
        n, used, capacity = replica.num_requests(), 0, replica.kv_capacity_tokens()
    else:       # the same sums as ReplicaView's accessors, inline: it runs for every replica
        s = load.stats
        prefill = load.queued_prefill_tokens + replica.since_prefill
        decode = load.remaining_decode_tokens + replica.since_decode
        n = s.num_waiting + s.num_running + len(replica.since)
        used = (s.num_total_blocks - s.num_free_blocks) * load.block_size
        capacity = s.num_total_blocks * load.block_size
    n = max(n, 1)
    surviving = math.exp(-horizon_steps / max(decode / n, 1.0))
    held = (used + n * horizon_steps) * surviving
    queued = prefill + p.prompt_tokens - (p.cached.get(replica.name, 0) if p.cached else 0)
    return (held + queued) / max(capacity, 1)


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
