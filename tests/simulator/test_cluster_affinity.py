"""Cluster mode with conversations: a turn follows the previous reply (never before it), and
prefix affinity sends it where the earlier turns are cached, which the replicas' prefix caches
show as hits."""
from lenserve.bench.cluster import ClusterSpec, simulate_cluster
from lenserve.workloads.types import BenchRequest, Workload
from tests.simulator.sim_helpers import make_spec, make_target

TURNS, CONVERSATIONS = 3, 6


def conversations() -> Workload:
    """Six conversations of three turns, starting 0.05 s apart; each turn's prompt is the one
    before plus 16 new tokens, asked 0.02 s after the previous reply."""
    reqs = []
    for c in range(CONVERSATIONS):
        prompt: tuple[int, ...] = ()
        for t in range(TURNS):
            prompt += tuple(1 + (37 * c + 11 * t + j) % 250 for j in range(16))
            reqs.append(BenchRequest(f"c{c}-t{t}", prompt, 4, 0.05 * c,
                                     after=f"c{c}-t{t - 1}" if t else None,
                                     think_s=0.02 if t else 0.0))
    return Workload("conversations", tuple(sorted(reqs, key=lambda r: r.arrival_offset)))


def run(router: str):
    spec = make_spec(predictor="oracle", target=make_target(num_gpu_blocks=64, block_size=4))
    return simulate_cluster(spec, ClusterSpec(3, router), conversations(), 1.0, False)


def test_a_turn_arrives_only_after_the_previous_reply():
    records = {r.request_id: r for r in run("round-robin").records}
    assert all(r.success for r in records.values())
    for c in range(CONVERSATIONS):
        for t in range(1, TURNS):
            prev, cur = records[f"c{c}-t{t - 1}"], records[f"c{c}-t{t}"]
            assert cur.arrival_time >= prev.finish_time + 0.02 - 1e-9


def test_affinity_turns_the_conversation_history_into_cache_hits():
    with_, without = run("length-aware").stats, run("length-aware:no-prefix").stats
    assert with_["affinity_placements"] == CONVERSATIONS * (TURNS - 1)
    # Every later turn finds its history on its replica: 16 or 32 tokens of history each.
    assert with_["prefix_cache_hits"] >= CONVERSATIONS * (16 + 32) * 0.9
    assert without["prefix_cache_hits"] < with_["prefix_cache_hits"] / 2
