"""The router's pure core: the replicas it knows, what each last reported (``ReplicaLoad``),
what this router placed on each since, and which requests run where. No sockets, no clock:
the gRPC shell (``servicer``) and the simulator's cluster mode drive the same object.

A replica is *up* while its load stream is open and it is not draining; only up replicas take
requests. When one is lost, ``replica_lost`` splits the requests placed on it: those that
have produced no output token go back for another placement, those that have end with an
error (their tokens cannot be replayed elsewhere without the client seeing them twice)."""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from services.router.affinity import PrefixMap
from services.router.residents import Remaining
from services.router.policies import RouterPolicy, make_router_policy, parse_router_spec
from services.scheduler.load import DEFAULT_OUTPUT_LEN, ReplicaLoad

# Time-model rates before a replica has reported fitted ones (T0, alpha, beta): the scheduler's
# own prior (a decode step 20 ms, a prompt token a 32nd of that).
PRIOR_RATES = (0.02 / 32, 0.0, 0.02)
DEFAULT_KV_TOKENS = 1 << 20     # a replica that has not reported its pool: no overflow
# Prefix affinity's load bound: a replica's cached blocks count only while it holds at most
# this many more unfinished requests than the least loaded one does (AFFINITY_SLACK of that
# count, and at least AFFINITY_MIN_SLACK): a popular prefix never piles on one replica.
AFFINITY_SLACK = 0.25
AFFINITY_MIN_SLACK = 4


@dataclass
class Placement:
    """A request as the router places it."""
    request_id: str
    prompt_tokens: int
    predicted_output_len: int = DEFAULT_OUTPUT_LEN
    replica: str = ""
    num_output_tokens: int = 0      # forwarded to the client so far
    attempts: int = 0               # placements so far (re-placed after a replica was lost)
    prefix_keys: tuple = ()         # chained keys of the prompt's leading full blocks
    # Per candidate replica, prompt tokens it likely holds cached (set by ``place``; empty
    # without prefix affinity).
    cached: dict[str, int] = field(default_factory=dict)

    def cached_on(self, replica: str) -> int:
        return self.cached.get(replica, 0)

    @property
    def started(self) -> bool:
        return self.num_output_tokens > 0


@dataclass
class ReplicaView:
    name: str
    index: int
    up: bool = False
    load: ReplicaLoad | None = None
    # Placed since the last load report, which does not count them yet: (prefill, decode),
    # and their sums (kept as they change: a placement reads them for every replica).
    since: dict[str, tuple[int, int]] = field(default_factory=dict)
    since_prefill: int = 0
    since_decode: int = 0
    placed: dict[str, Placement] = field(default_factory=dict)      # unfinished, this router's
    num_placed: int = 0
    # ``placed`` less ``since`` as of the last report, read by remaining output (built when
    # first asked for after each report).
    _remaining: Remaining | None = field(default=None, repr=False, compare=False)

    def count_since(self, request_id: str, prefill: int, decode: int) -> None:
        self.drop_since(request_id)
        self.since[request_id] = (prefill, decode)
        self.since_prefill += prefill
        self.since_decode += decode

    def drop_since(self, request_id: str) -> None:
        got = self.since.pop(request_id, None)
        if got is not None:
            self.since_prefill -= got[0]
            self.since_decode -= got[1]

    def finished(self, request_id: str) -> None:
        """The request ended here (or left): it counts nowhere on this replica any more."""
        self.placed.pop(request_id, None)
        self.drop_since(request_id)
        if self._remaining is not None:
            self._remaining.finished(request_id)

    def clear_since(self) -> None:
        self.since.clear()
        self.since_prefill = self.since_decode = 0
        self._remaining = None

    def remaining(self) -> Remaining:
        """This router's unfinished requests here, less those placed since the last report
        (``since`` holds those), by predicted remaining output."""
        if self._remaining is None:
            self._remaining = Remaining(p for rid, p in self.placed.items()
                                        if rid not in self.since)
        return self._remaining

    def preempts_by_length(self) -> bool:
        """The replica's policy lets a request predicted shorter take a resident's place
        (``ReplicaLoad.preempts_by_length``): a new request's wait there does not follow its
        pool's fill."""
        return self.load is not None and self.load.preempts_by_length

    def rates(self) -> tuple[float, float, float]:
        rates = self.load.rates if self.load is not None else None
        return rates or PRIOR_RATES

    def num_requests(self) -> int:
        if self.load is None:
            return len(self.placed)
        return self.load.stats.num_waiting + self.load.stats.num_running + len(self.since)

    def pending_tokens(self) -> tuple[int, int]:
        """(prefill, decode) tokens still to run: the report's, plus placements since."""
        prefill, decode = self.since_prefill, self.since_decode
        if self.load is None:
            return prefill, decode
        return self.load.queued_prefill_tokens + prefill, self.load.remaining_decode_tokens + decode

    def kv_tokens_used(self) -> int:
        """Tokens of KV the pool holds now (0 before a report)."""
        if self.load is None:
            return 0
        s = self.load.stats
        return (s.num_total_blocks - s.num_free_blocks) * self.load.block_size

    def kv_capacity_tokens(self) -> int:
        if self.load is None:
            return DEFAULT_KV_TOKENS
        return self.load.stats.num_total_blocks * self.load.block_size


def holds_cache(replica: ReplicaView) -> bool:
    """False when the replica's last report shows it has run iterations yet holds no cached
    block on either tier: it runs without prefix caching (``--no-prefix-caching``), or has
    evicted everything, and the prefix map's entries for it are stale. Counting them would
    send a conversation's turns back to a replica that recomputes them anyway, and would
    count their prompts as needing no new KV there. True before the first report, and while
    the last one predates the replica's first iteration (a prompt placed since may be cached
    by now)."""
    if replica.load is None:
        return True
    s = replica.load.stats
    return s.num_cached_blocks > 0 or s.num_host_cached_blocks > 0 or s.num_iterations == 0


class NoReplica(Exception):
    """No replica is up to take the request."""


class RouterCore:
    """``policy``: a policy or its spec (``NAME`` or ``NAME:no-prefix``, which turns prefix
    affinity off for a policy that uses it)."""

    def __init__(self, policy: str | RouterPolicy = "length-aware",
                 prefix_affinity: bool = True, prefix: PrefixMap | None = None):
        if isinstance(policy, str):
            name, prefix_affinity = parse_router_spec(policy, prefix_affinity)
            policy = make_router_policy(name)
        self.policy = policy
        self.prefix = (prefix or PrefixMap()) if prefix_affinity and policy.uses_prefix \
            else None
        self.num_affinity_hits = 0  # placed where the map expected cached blocks
        self.replicas: dict[str, ReplicaView] = {}
        self.requests: dict[str, Placement] = {}
        self.num_replaced = 0       # placed again after their replica was lost
        self.num_failed = 0         # ended with an error when their replica was lost
        self.num_placements = 0     # decisions made, and the time spent in them (the policy's
        self.place_ns = 0           # choice and the bookkeeping; a counter, not a histogram)

    # -- membership --------------------------------------------------------------------------
    def add_replica(self, name: str) -> ReplicaView:
        if name not in self.replicas:
            self.replicas[name] = ReplicaView(name, len(self.replicas))
        return self.replicas[name]

    def on_load(self, name: str, load: ReplicaLoad) -> None:
        """A load report: the replica is up (unless draining) and counts what was placed."""
        view = self.replicas[name]
        view.load, view.up = load, not load.draining
        view.clear_since()
        if self.prefix is not None:
            self.prefix.set_block_size(load.block_size)

    def up_replicas(self, exclude: frozenset[str] = frozenset()) -> list[ReplicaView]:
        return [r for r in self.replicas.values() if r.up and r.name not in exclude]

    def replica_lost(self, name: str) -> tuple[list[Placement], list[Placement]]:
        """Mark the replica down. Returns (to place again, to fail): its requests that had
        not produced a token, and those that had."""
        view = self.replicas[name]
        view.up, view.load = False, None
        view.clear_since()
        if self.prefix is not None:
            self.prefix.forget(name)
        lost = list(view.placed.values())
        view.placed.clear()
        replace = [p for p in lost if not p.started]
        fail = [p for p in lost if p.started]
        for p in fail:
            self.requests.pop(p.request_id, None)
        self.num_replaced += len(replace)
        self.num_failed += len(fail)
        return replace, fail

    def remove_replica(self, name: str) -> tuple[list[Placement], list[Placement]]:
        """A replica gone from discovery: lost, and forgotten."""
        result = self.replica_lost(name)
        del self.replicas[name]
        return result

    # -- requests ----------------------------------------------------------------------------
    def prefix_keys(self, token_ids=(), text: str = "") -> tuple:
        """The keys ``Placement.prefix_keys`` wants (empty without prefix affinity)."""
        return self.prefix.keys(token_ids, text) if self.prefix is not None else ()

    def _cached(self, candidates: list[ReplicaView], placement: Placement) -> dict[str, int]:
        """Tokens each candidate likely holds, counted only within the load bound and only on
        replicas whose last report shows a cached block (``holds_cache``)."""
        blocks = self.prefix.cached_blocks(placement.prefix_keys, (r.name for r in candidates))
        if not any(blocks.values()):
            return {}
        counts = [r.num_requests() for r in candidates]
        least = min(counts)
        bound = least + max(AFFINITY_MIN_SLACK, AFFINITY_SLACK * least)
        size = self.prefix.block_size
        return {r.name: min(blocks[r.name] * size, placement.prompt_tokens - 1)
                for r, count in zip(candidates, counts)
                if blocks[r.name] and count <= bound and holds_cache(r)}

    def place(self, placement: Placement, exclude: frozenset[str] = frozenset()) -> ReplicaView:
        """Choose a replica for ``placement`` and count it there; NoReplica if none is up."""
        t0 = time.perf_counter_ns()
        candidates = self.up_replicas(exclude) or self.up_replicas()
        if not candidates:
            raise NoReplica("no scheduler replica is up")
        if self.prefix is not None and placement.prefix_keys:
            placement.cached = self._cached(candidates, placement)
        view = self.policy.choose(candidates, placement)
        if self.prefix is not None:
            self.num_affinity_hits += placement.cached_on(view.name) > 0
            self.prefix.record(placement.prefix_keys, view.name)
        placement.replica = view.name
        placement.attempts += 1
        view.placed[placement.request_id] = placement
        view.count_since(placement.request_id,
                         placement.prompt_tokens - placement.cached_on(view.name),
                         placement.predicted_output_len)
        view.num_placed += 1
        self.requests[placement.request_id] = placement
        self.num_placements += 1
        self.place_ns += time.perf_counter_ns() - t0
        return view

    def on_tokens(self, request_id: str, num_tokens: int) -> None:
        placement = self.requests.get(request_id)
        if placement is not None:
            placement.num_output_tokens += num_tokens

    def on_finished(self, request_id: str) -> None:
        placement = self.requests.pop(request_id, None)
        if placement is not None:
            view = self.replicas.get(placement.replica)
            if view is not None:
                view.finished(request_id)

    def unplace(self, request_id: str) -> None:
        """A placement the replica refused or never received (forgotten, not finished)."""
        self.on_finished(request_id)
