"""The router's pure core: each policy's placement in a scenario built to tell them apart,
and what a lost replica does to the requests placed on it."""
from __future__ import annotations

import pytest

from services.router.core import NoReplica, Placement, RouterCore
from services.router.policies import make_router_policy, projected_kv_share
from services.scheduler.load import ReplicaLoad
from services.scheduler.scheduler import SchedulerStats


def load(waiting=0, running=0, prefill=0, decode=0, free=1000, total=1000, draining=False,
         rates=None, cached=0, iterations=0) -> ReplicaLoad:
    stats = SchedulerStats("vllm", waiting, running, 0, free, total, iterations, 0, 0,
                           num_cached_blocks=cached)
    return ReplicaLoad(stats, 16, prefill, decode, 0, rates, draining)


def core_with(policy: str, **loads) -> RouterCore:
    core = RouterCore(policy)
    for name, report in loads.items():
        core.add_replica(name)
        core.on_load(name, report)
    return core


def test_length_aware_places_where_the_pool_frees_soonest_where_least_loaded_counts():
    # Both pools are full. a: one long conversation (2,000 tokens to go) frees nothing for a
    # long while; b: three nearly done requests free theirs within ten steps.
    reports = dict(a=load(running=1, decode=2000, free=0), b=load(running=3, decode=30, free=0))
    assert core_with("least-loaded", **reports).place(Placement("r", 100, 200)).name == "a"
    assert core_with("length-aware", **reports).place(Placement("r", 100, 200)).name == "b"


def test_length_aware_avoids_a_replica_whose_pool_cannot_take_the_prompt_now():
    # Same requests, same predictions; a's pool has room for 160 tokens, b's for 16,000.
    reports = dict(a=load(running=2, decode=100, free=10), b=load(running=2, decode=100))
    assert core_with("length-aware", **reports).place(Placement("r", 500, 1000)).name == "b"
    assert core_with("least-loaded", **reports).place(Placement("r", 500, 1000)).name == "a"


def test_placements_between_reports_count_so_a_burst_spreads():
    core = core_with("length-aware", a=load(), b=load(), c=load())
    chosen = [core.place(Placement(f"r{i}", 100, 300)).name for i in range(6)]
    assert sorted(chosen) == ["a", "a", "b", "b", "c", "c"]
    core.on_load("a", load())           # a report counts them: the extra is dropped
    assert core.replicas["a"].since == {}


def test_round_robin_takes_turns_whatever_the_load():
    core = core_with("round-robin", a=load(running=50), b=load())
    assert [core.place(Placement(f"r{i}", 10)).name for i in range(4)] == ["a", "b", "a", "b"]


def test_a_lost_replica_gives_back_its_unstarted_requests_and_fails_its_started_ones():
    core = core_with("round-robin", a=load(), b=load())
    placed = [core.place(Placement(f"r{i}", 10)) for i in range(4)]
    assert [v.name for v in placed] == ["a", "b", "a", "b"]
    core.on_tokens("r0", 3)             # r0 has streamed tokens; r2 has not
    replace, fail = core.replica_lost("a")
    assert [p.request_id for p in replace] == ["r2"] and [p.request_id for p in fail] == ["r0"]
    assert not core.replicas["a"].up and "r0" not in core.requests
    assert core.place(replace[0], frozenset({"a"})).name == "b"     # placed elsewhere
    assert replace[0].attempts == 2
    core.on_load("a", load())           # it came back: used again
    core.policy = make_router_policy("least-loaded")
    assert core.place(Placement("r9", 10)).name == "a"


def test_no_replica_up_or_all_draining_refuses():
    core = core_with("least-loaded", a=load(draining=True))
    with pytest.raises(NoReplica):
        core.place(Placement("r", 10))
    core.add_replica("b")               # known but never reported: not up
    with pytest.raises(NoReplica):
        core.place(Placement("r", 10))


def test_finished_requests_leave_the_replica():
    core = core_with("least-loaded", a=load(), b=load())
    core.place(Placement("r0", 10))
    core.on_finished("r0")
    assert not core.requests and all(not v.placed and not v.since
                                     for v in core.replicas.values())


def test_unknown_policy_is_refused_with_the_choices():
    with pytest.raises(ValueError, match="length-aware"):
        RouterCore("random")


def test_length_aware_with_fitted_rates_joins_the_lighter_batch_when_both_pools_have_room():
    # Both pools have room and nothing queued: the wait is the same. a runs 30 requests over
    # 600 tokens of KV, b 5 over 100: each step of a long request is slower on a.
    rates = (1e-4, 2e-6, 5e-4)
    reports = dict(a=load(running=30, decode=3000, free=1000 - 38, rates=rates),
                   b=load(running=5, decode=500, free=1000 - 7, rates=rates))
    core = core_with("length-aware", **reports)
    assert [core.place(Placement(f"r{i}", 50, 400)).name for i in range(4)] == ["b"] * 4


def test_length_aware_avoids_the_pool_a_long_running_decode_set_will_fill():
    # 1,536-block pools (24,576 tokens), nothing queued, both with room for the prompt now.
    # a: 10 requests with ~400 tokens each still to generate, 19,664 tokens held: it grows
    # ten tokens a step and fills within ~500 steps, then preempts. b: 12 requests holding a
    # little more (20,896 tokens) that are all predicted to finish within ~5 steps, freeing
    # nearly all of it. least-loaded counts a as lighter; a current-KV or decode-time score
    # (with fitted rates) also prefers a; the projection a few steps ahead prefers b.
    rates = (1e-4, 2e-6, 5e-4)
    reports = dict(a=load(running=10, decode=4000, free=1536 - 1229, total=1536, rates=rates),
                   b=load(running=12, decode=60, free=1536 - 1306, total=1536, rates=rates))
    assert core_with("least-loaded", **reports).place(Placement("r", 100, 300)).name == "a"
    core = core_with("length-aware", **reports)
    assert [core.place(Placement(f"r{i}", 100, 300)).name for i in range(3)] == ["b"] * 3


def test_length_aware_takes_the_smaller_batch_among_pools_projected_alike():
    # 1,536-block pools, fitted rates of a simulated A100 (a step costs 1.7 us per token of
    # KV read and 11.8 ms per request, the fixed cost folded in). a holds 80 requests in
    # 20,800 tokens, b 40 in 21,600: a's projected share is a little lower (more of its
    # requests finish within the horizon), but every one of a's 80 requests pays its step,
    # and each step runs twice as many requests. Within the band the time model decides: b.
    rates = (4.65e-5, 1.72e-6, 0.0118)
    reports = dict(a=load(running=80, decode=80 * 200, free=1536 - 1300, total=1536,
                          rates=rates),
                   b=load(running=40, decode=40 * 200, free=1536 - 1350, total=1536,
                          rates=rates))
    core = core_with("length-aware", **reports)
    share = {n: projected_kv_share(v, Placement("r", 100, 200))
             for n, v in core.replicas.items()}
    assert share["a"] < share["b"] < share["a"] + 0.1
    assert core.place(Placement("r", 100, 200)).name == "b"
    # Beyond the band the pool decides, however many requests b holds fewer: a's pool is
    # projected to hold far less than b's, which is about to turn prompts away.
    reports["b"] = load(running=40, decode=40 * 2000, free=0, total=1536, rates=rates)
    core = core_with("length-aware", **reports)
    assert core.place(Placement("r", 100, 200)).name == "a"
