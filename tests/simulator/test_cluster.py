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


def _ttft_of_third_request(router: str) -> float:
    # Two replicas, a 256-token pool each, each filled by one 200-token prompt: a's request
    # has 45 tokens to generate, b's 20. When the third arrives both hold one request (a tie
    # by count) and neither pool has room for its 60-token prompt; b's frees first.
    spec = make_spec(predictor="oracle", max_model_len=256)
    reqs = workload((200, 45, 0.0), (200, 20, 0.001), (60, 5, 0.15))
    run = simulate_cluster(spec, ClusterSpec(2, router), reqs, 1.0, False)
    assert all(r.success for r in run.records)
    third = run.records[2]
    return third.token_times[0] - third.arrival_time


def test_length_aware_places_where_the_pool_frees_soonest_not_by_request_count():
    least, aware = _ttft_of_third_request("least-loaded"), _ttft_of_third_request("length-aware")
    assert aware < least / 2


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


def test_the_router_sees_the_tokens_its_requests_produced(monkeypatch):
    # A live router counts each request's tokens as it relays them; length-aware reads them
    # (what a request still has to run). Here they are counted at each load report: when the
    # second and third requests arrive, those before them have produced tens of tokens.
    from services.router.core import RouterCore
    seen = []
    place = RouterCore.place

    def spy(self, placement, exclude=frozenset()):
        seen.append(sorted(p.num_output_tokens for p in self.requests.values()))
        return place(self, placement, exclude)
    monkeypatch.setattr(RouterCore, "place", spy)
    simulate_cluster(make_spec(predictor="oracle", max_model_len=256),
                     ClusterSpec(2, "length-aware"),
                     workload((8, 200, 0.0), (8, 200, 0.2), (8, 200, 0.4)), 1.0, False)
    assert seen[0] == [] and len(seen[1]) == 1 and len(seen[2]) == 2
    assert min(seen[1]) >= 10 and min(seen[2]) >= 10
