"""``/metrics`` is Prometheus text and counts what the gateway served."""
from __future__ import annotations

import httpx
import pytest
from gateway_helpers import API_KEY, ServedScheduler, start_gateway
from prometheus_client.parser import text_string_to_metric_families

from tests.predictor.conftest import free_port

AUTH = {"Authorization": f"Bearer {API_KEY}"}


def scrape(live) -> dict[str, list]:
    resp = httpx.get(live.url + "/metrics", headers=AUTH)
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/plain")
    return {f.name: f.samples for f in text_string_to_metric_families(resp.text)}


def value(samples, name: str, **labels) -> float:
    return sum(s.value for s in samples if s.name == name
               and all(s.labels.get(k) == v for k, v in labels.items()))


def test_metrics_count_requests_and_tokens(live, client):
    before = scrape(live)
    for _ in range(3):
        client.completions.create(model="fake", prompt="count me", max_tokens=4)
    httpx.post(live.url + "/v1/completions", json={"prompt": "x", "n": 17}, headers=AUTH)
    after = scrape(live)

    def delta(family, name, **labels):
        return value(after[family], name, **labels) - value(before.get(family, []), name, **labels)
    assert delta("lenserve_gateway_requests", "lenserve_gateway_requests_total",
                 endpoint="/v1/completions", status="200") == 3
    assert delta("lenserve_gateway_requests", "lenserve_gateway_requests_total",
                 endpoint="/v1/completions", status="400") == 1
    assert delta("lenserve_generation_tokens", "lenserve_generation_tokens_total") == 12
    assert delta("lenserve_time_to_first_token_seconds",
                 "lenserve_time_to_first_token_seconds_count") == 3
    assert delta("lenserve_e2e_request_latency_seconds",
                 "lenserve_e2e_request_latency_seconds_count") == 3


def test_metrics_carry_scheduler_stats(live):
    families = scrape(live)
    for name in ("lenserve_num_requests_waiting", "lenserve_num_requests_running",
                 "lenserve_num_requests_swapped", "lenserve_kv_cache_usage_ratio",
                 "lenserve_host_kv_usage_ratio"):
        assert name in families
    assert value(families["lenserve_kv_total_blocks"], "lenserve_kv_total_blocks") > 0


@pytest.mark.parametrize("transport", ["inprocess", "grpc"])
def test_metrics_count_completion_records_kafka_dropped(transport):
    """Kafka unreachable and a buffer of 2: of 5 finished requests, 2 records wait and the
    3 oldest are dropped, and /metrics says so, in-process and through the scheduler's
    stats RPC alike."""
    served = []

    def wrap(engine):
        if transport == "inprocess":
            return engine
        served.append(ServedScheduler(engine))
        return served[-1].backend

    live, server = start_gateway(
        dict(predictor="oracle", kafka_bootstrap=f"127.0.0.1:{free_port()}",
             kafka_max_buffered=2), wrap=wrap)
    try:
        client = live.client()
        for i in range(5):
            client.completions.create(model="fake", prompt=f"record {i}", max_tokens=3)
        assert live.engine.engine.predictions.flush(10)
        families = scrape(live)
        assert value(families["lenserve_kafka_completions_dropped"],
                     "lenserve_kafka_completions_dropped_total") == 3
        assert value(families["lenserve_kafka_completions_buffered"],
                     "lenserve_kafka_completions_buffered") == 2
        assert value(families["lenserve_kafka_completions_published"],
                     "lenserve_kafka_completions_published_total") == 0
        assert value(families["lenserve_completion_records_reported"],
                     "lenserve_completion_records_reported_total") == 5
        assert value(families["lenserve_completion_records_dropped"],
                     "lenserve_completion_records_dropped_total") == 0
        assert value(families["lenserve_predictor_predictions"],
                     "lenserve_predictor_predictions_total") == 5
    finally:
        server.stop()
        for s in served:
            s.stop()
        live.engine.shutdown()


def test_metrics_without_a_predictor_count_nothing_dropped(live):
    families = scrape(live)
    for name in ("lenserve_kafka_completions_dropped", "lenserve_predictor_predictions"):
        assert value(families[name], name + "_total") == 0


@pytest.mark.parametrize("transport", ["inprocess", "grpc"])
def test_metrics_export_the_prefix_cache_hits_of_a_repeated_prompt(transport):
    served = []

    def wrap(engine):
        if transport == "inprocess":
            return engine
        served.append(ServedScheduler(engine))
        return served[-1].backend

    live, server = start_gateway({}, wrap=wrap)
    try:
        client = live.client()
        prompt = "a system prompt that every request repeats. " * 3      # 132 char tokens
        for question in ("first?", "second?"):
            client.completions.create(model="fake", prompt=prompt + question, max_tokens=2)
        families = scrape(live)
        queries = value(families["lenserve_prefix_cache_queries"],
                        "lenserve_prefix_cache_queries_total")
        hits = value(families["lenserve_prefix_cache_hits"], "lenserve_prefix_cache_hits_total")
        # Char tokens, blocks of 16: the second request finds the 8 full blocks of the shared
        # 132 characters cached.
        assert len(prompt) == 132
        assert queries == (132 + 6) + (132 + 7) and hits == 8 * 16
        assert value(families["lenserve_prefix_cache_hit_rate"],
                     "lenserve_prefix_cache_hit_rate") == pytest.approx(hits / queries)
    finally:
        server.stop()
        for s in served:
            s.stop()
        live.engine.shutdown()
