"""``/metrics`` is Prometheus text and counts what the gateway served."""
from __future__ import annotations

import httpx
from gateway_helpers import API_KEY
from prometheus_client.parser import text_string_to_metric_families

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
    httpx.post(live.url + "/v1/completions", json={"prompt": "x", "n": 2}, headers=AUTH)
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
