"""Cluster mode: the real router core over simulated replicas, each with its own clock."""
import pytest

from lenserve.bench.cluster import ClusterSpec, simulate_cluster
from lenserve.bench.simulation import simulate
from tests.simulator.sim_helpers import make_spec, workload


def test_replicas_run_side_by_side_each_on_its_own_clock():
    spec = make_spec(predictor="oracle")
    alone = simulate(spec, workload((8, 5, 0.0)), 1.0, False).records[0].token_times
    run = simulate_cluster(spec, ClusterSpec(2, "round-robin"),
                           workload((8, 5, 0.0), (8, 5, 0.0)), 1.0, False)
    assert [r.token_times for r in run.records] == [pytest.approx(alone)] * 2
    assert run.stats["placed_per_replica"] == [1, 1]


def _ttft_of_short_request(router: str) -> float:
    # One request at a time per replica. A long request lands on one replica and a shorter
    # one on the other; the third, short, ties the two on request count, but one replica has
    # ten times the predicted work left.
    spec = make_spec(predictor="oracle", max_num_seqs=1, max_model_len=256)
    reqs = workload((8, 200, 0.0), (8, 20, 0.001), (8, 5, 0.002))
    run = simulate_cluster(spec, ClusterSpec(2, router), reqs, 1.0, False)
    assert all(r.success for r in run.records)
    third = run.records[2]
    return third.token_times[0] - third.arrival_time


def test_length_aware_places_behind_less_predicted_work_than_least_loaded():
    least, aware = _ttft_of_short_request("least-loaded"), _ttft_of_short_request("length-aware")
    assert aware < least / 5         # behind 20 tokens of work, not 200


def test_the_router_predicts_once_and_replicas_take_its_length():
    run = simulate_cluster(make_spec("alise", predictor="oracle:0.5:1"),
                           ClusterSpec(3, "length-aware"),
                           workload(*[(8, 10 + i, 0.01 * i) for i in range(9)]), 1.0, False)
    assert all(r.success and r.predicted_len and r.prediction_source == "oracle"
               for r in run.records)
    assert sum(run.stats["placed_per_replica"]) == 9


def test_a_predictor_that_needs_prompt_text_is_refused_in_cluster_mode():
    with pytest.raises(ValueError, match="oracle"):
        simulate_cluster(make_spec(predictor="embedded"), ClusterSpec(2, "length-aware"),
                         workload((8, 5, 0.0)), 1.0, False)
