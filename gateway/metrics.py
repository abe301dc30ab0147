"""Prometheus metrics, in a registry of the app's own (two apps in one process do not share).

Latencies are measured at the gateway, from the request reaching the handler: TTFT to the
first generated token, TPOT over the rest, E2E to the last. Scheduler gauges are read from
``stats()`` when scraped: its levels as gauges, its running totals (predictions, completion
records reported, delivered to Kafka or dropped) as counters."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                   10.0, 30.0, 60.0, 120.0)
TPOT_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
# SchedulerStats field -> (gauge name, help)
STAT_GAUGES = {
    "num_waiting": ("lenserve_num_requests_waiting", "requests queued for admission"),
    "num_running": ("lenserve_num_requests_running", "requests in the running batch"),
    "num_preempted": ("lenserve_num_requests_preempted", "requests preempted or swapped out"),
    "num_swapped": ("lenserve_num_requests_swapped", "requests whose KV is on the host tier"),
    "num_free_blocks": ("lenserve_kv_free_blocks", "free device KV blocks"),
    "num_total_blocks": ("lenserve_kv_total_blocks", "device KV blocks"),
    "num_free_host_blocks": ("lenserve_host_kv_free_blocks", "free host KV blocks"),
    "num_host_blocks": ("lenserve_host_kv_total_blocks", "host KV blocks"),
    "num_preemptions": ("lenserve_num_preemptions", "preemptions so far"),
    "num_iterations": ("lenserve_num_iterations", "scheduler iterations so far"),
    "num_kafka_buffered": ("lenserve_kafka_completions_buffered",
                           "completion records waiting for Kafka"),
    "num_cached_blocks": ("lenserve_prefix_cache_blocks",
                          "device KV blocks whose KV the prefix cache indexes"),
    "num_host_cached_blocks": ("lenserve_prefix_cache_host_blocks",
                               "host KV blocks the prefix cache's host tier holds"),
    "prefix_cache_hit_rate": ("lenserve_prefix_cache_hit_rate",
                              "prompt tokens served from the prefix cache / looked up, so far"),
}
# SchedulerStats running totals -> (counter name, exposed with _total; help)
STAT_COUNTERS = {
    "num_predictions": ("lenserve_predictor_predictions",
                        "length predictions made (defaults included where the "
                        "predictor failed; see lenserve_prediction_source)"),
    "num_completions_reported": ("lenserve_completion_records_reported",
                                 "completion records handed to the predictor or to Kafka"),
    "num_completions_dropped": ("lenserve_completion_records_dropped",
                                "completion records lost before being handed on"),
    "num_kafka_published": ("lenserve_kafka_completions_published",
                            "completion records Kafka acknowledged"),
    "num_kafka_dropped": ("lenserve_kafka_completions_dropped",
                          "completion records dropped because the Kafka buffer was full"),
    "prefix_cache_queries": ("lenserve_prefix_cache_queries",
                             "prompt tokens looked up in the prefix cache at admissions"),
    "prefix_cache_hits": ("lenserve_prefix_cache_hits",
                          "prompt tokens served from the prefix cache (prefill skipped)"),
    "prefix_cache_host_hits": ("lenserve_prefix_cache_host_hits",
                               "of those, prompt tokens uploaded from the host tier"),
    "num_upload_waits": ("lenserve_kv_upload_waits",
                         "swap-ins an iteration waited for before it ran"),
    "num_uploads_ahead": ("lenserve_kv_uploads_ahead",
                          "swap-ins issued ahead of need, overlapping an iteration"),
}


class StatCounters:
    """The scheduler's running totals, as Prometheus counters of the last snapshot (none
    before the first one: a scrape whose ``stats()`` failed keeps the last values)."""

    def __init__(self):
        self.stats = None

    def collect(self):
        if self.stats is None:
            return
        for field, (name, text) in STAT_COUNTERS.items():
            family = CounterMetricFamily(name, text)
            family.add_metric([], float(getattr(self.stats, field, 0) or 0))
            yield family


class GatewayMetrics:
    def __init__(self):
        self.registry = r = CollectorRegistry()
        self.requests = Counter("lenserve_gateway_requests", "requests answered",
                                ["endpoint", "status"], registry=r)
        self.rejected = Counter("lenserve_gateway_rejected", "requests refused at admission",
                                ["reason"], registry=r)
        self.ttft = Histogram("lenserve_time_to_first_token_seconds", "TTFT",
                              buckets=LATENCY_BUCKETS, registry=r)
        self.tpot = Histogram("lenserve_time_per_output_token_seconds", "TPOT",
                              buckets=TPOT_BUCKETS, registry=r)
        self.e2e = Histogram("lenserve_e2e_request_latency_seconds", "E2E latency",
                             buckets=LATENCY_BUCKETS, registry=r)
        self.tokens = Counter("lenserve_generation_tokens", "tokens generated", registry=r)
        self.prompt_tokens = Counter("lenserve_prompt_tokens", "prompt tokens", registry=r)
        self.prediction_source = Counter("lenserve_prediction_source", "length predictions "
                                         "by source", ["source"], registry=r)
        self.stats = {field: Gauge(name, text, registry=r)
                      for field, (name, text) in STAT_GAUGES.items()}
        self.kv_usage = Gauge("lenserve_kv_cache_usage_ratio", "device KV blocks in use",
                              registry=r)
        self.host_kv_usage = Gauge("lenserve_host_kv_usage_ratio", "host KV blocks in use",
                                   registry=r)
        self.stat_counters = StatCounters()
        r.register(self.stat_counters)

    def finished(self, ttft: float | None, e2e: float, num_prompt: int, num_output: int,
                 prediction_source: str | None) -> None:
        if ttft is not None:
            self.ttft.observe(ttft)
            if num_output > 1:
                self.tpot.observe((e2e - ttft) / (num_output - 1))
        self.e2e.observe(e2e)
        self.tokens.inc(num_output)
        self.prompt_tokens.inc(num_prompt)
        if prediction_source:
            self.prediction_source.labels(prediction_source).inc()

    def render(self, stats) -> bytes:
        if stats is not None:
            self._set_stats(stats)
        return generate_latest(self.registry)

    def _set_stats(self, stats) -> None:
        for field, gauge in self.stats.items():
            gauge.set(getattr(stats, field, 0) or 0)
        self.kv_usage.set(used_ratio(stats, "num_free_blocks", "num_total_blocks"))
        self.host_kv_usage.set(used_ratio(stats, "num_free_host_blocks", "num_host_blocks"))
        self.stat_counters.stats = stats


def used_ratio(stats, free_field: str, total_field: str) -> float:
    total = getattr(stats, total_field, 0) or 0
    return 1.0 - (getattr(stats, free_field, 0) or 0) / total if total else 0.0
