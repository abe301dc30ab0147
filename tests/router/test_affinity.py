"""Prefix affinity: a conversation's next turn goes where its earlier turns are cached, within
a load bound, and the map stays bounded and forgets a lost replica's cache."""
from __future__ import annotations

import pytest

from services.router.affinity import PrefixMap
from services.router.core import AFFINITY_MIN_SLACK, Placement, RouterCore
from tests.router.test_core import core_with
from tests.router.test_core import load as bare_load

TURN_1 = list(range(1000, 1064))                # 64 tokens: four blocks of 16
TURN_2 = TURN_1 + list(range(2000, 2040))       # the next turn carries the first


def load(cached: int = 8, **kw):
    """A report from a replica that has run (``cached`` blocks indexed; 0: prefix caching
    off)."""
    return bare_load(cached=cached, iterations=10, **kw)


def place(core: RouterCore, rid: str, tokens: list[int]) -> str:
    p = Placement(rid, len(tokens), 100, prefix_keys=core.prefix_keys(tokens))
    return core.place(p).name


def next_turn_replica(policy: str, cached: int = 8) -> tuple[str, str]:
    """(replica of turn 1, replica of turn 2), equal loads throughout; other requests come and
    go between the turns, as other users' would. ``cached``: the blocks each replica reports
    indexed (0: prefix caching off)."""
    core = core_with(policy, a=load(cached), b=load(cached), c=load(cached))
    first = place(core, "turn-1", TURN_1)
    core.on_finished("turn-1")
    for i in range(4):
        place(core, f"other-{i}", list(range(5000 + 100 * i, 5000 + 100 * i + 48)))
        core.on_finished(f"other-{i}")
    for name in "abc":
        core.on_load(name, load(cached))
    return first, place(core, "turn-2", TURN_2)


@pytest.mark.parametrize("policy", ["length-aware", "prefix-affinity"])
def test_a_conversations_next_turn_goes_where_its_previous_turn_ran(policy):
    first, second = next_turn_replica(policy)
    assert second == first


def test_without_affinity_the_next_turn_lands_wherever_the_rotation_is():
    first, second = next_turn_replica("length-aware:no-prefix")
    assert second != first


@pytest.mark.parametrize("policy", ["length-aware", "prefix-affinity"])
def test_replicas_that_report_nothing_cached_get_no_affinity(policy):
    # Replicas run with --no-prefix-caching: the map still lists where turn 1 went, but the
    # reports show no cached block, so turn 2 is placed by load alone (the rotation here).
    first, second = next_turn_replica(policy, cached=0)
    assert second != first
    core = core_with(policy, a=load(0), b=load(0))
    place(core, "t1", TURN_1)
    p = Placement("t2", len(TURN_2), 100, prefix_keys=core.prefix_keys(TURN_2))
    core.place(p)
    assert p.cached == {} and core.num_affinity_hits == 0
    # A replica that has not run an iteration yet may have cached what was placed since.
    fresh = core_with(policy, a=bare_load(), b=bare_load())
    first = place(fresh, "t1", TURN_1)
    assert place(fresh, "t2", TURN_2) == first


def test_affinity_wins_over_a_slightly_busier_replica_but_not_a_much_busier_one():
    core = core_with("prefix-affinity", a=load(running=3), b=load(running=2))
    assert place(core, "t1", TURN_1) == "b"          # no cache anywhere: the less loaded
    core.on_finished("t1")
    core.on_load("b", load(running=3))
    core.on_load("a", load(running=2))
    assert place(core, "t2", TURN_2) == "b"          # cached there: worth one more request
    core.on_finished("t2")
    core.on_load("b", load(running=40))
    assert place(core, "t3", TURN_2) == "a"          # past the load bound: cache ignored


def test_a_prefix_every_request_shares_never_piles_on_one_replica():
    # Thirty requests with one system prompt, none finishing, no report in between: with no
    # bound every one would follow the cache to the first replica.
    core = core_with("prefix-affinity", a=load(), b=load(), c=load())
    for i in range(30):
        place(core, f"r{i}", TURN_1 + [i] * 16)
    counts = [len(v.placed) for v in core.replicas.values()]
    assert max(counts) - min(counts) <= AFFINITY_MIN_SLACK + 1
    assert core.num_affinity_hits > 10              # yet most still reused a cached prefix


def test_a_lost_replica_takes_its_cache_with_it():
    core = core_with("prefix-affinity", a=load(), b=load())
    first = place(core, "t1", TURN_1)
    core.on_finished("t1")
    core.replica_lost(first)
    core.on_load(first, load())                      # back, with an empty cache
    keys = core.prefix_keys(TURN_2)
    assert core.prefix.cached_blocks(keys, ["a", "b"]) == {"a": 0, "b": 0}


def test_the_map_is_bounded_and_keys_chain_over_blocks():
    pm = PrefixMap(block_size=4, capacity=8)
    k1, k2 = pm.keys([1, 2, 3, 4, 5, 6, 7, 8, 9]), pm.keys([9, 2, 3, 4, 5, 6, 7, 8])
    assert len(k1) == 2 and k1[1] != k2[1]           # the second block differs by its parent
    pm.record(k1, "a")
    assert pm.cached_blocks(k1, ["a", "b"]) == {"a": 2, "b": 0}
    for i in range(10):
        pm.record(pm.keys(list(range(100 * i, 100 * i + 4))), "b")
    assert len(pm) == 8 and pm.cached_blocks(k1, ["a"]) == {"a": 0}    # oldest dropped first
    assert len(pm.keys(text="x" * 130)) == 130 // 16     # text: 4 characters a token


def test_no_prefix_spec_and_policies_without_prefix_keep_no_map():
    assert RouterCore("length-aware").prefix is not None
    assert RouterCore("length-aware:no-prefix").prefix is None
    assert RouterCore("least-loaded").prefix is None
    assert RouterCore("length-aware", prefix_affinity=False).prefix is None
