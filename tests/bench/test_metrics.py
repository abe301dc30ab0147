"""Metric definitions, checked on hand-computed records."""
from __future__ import annotations

import math
import random

import numpy as np
import pytest

from lenserve.bench.metrics import (
    JctSlo,
    RequestRecord,
    meets_slos,
    parse_goodput,
    parse_jct_slo,
    slo_satisfaction_ratio,
    summarize,
)


def record(rid="r", arrival=0.0, times=(1.0, 1.5, 2.5), finish=None, output_len=3, **kw):
    return RequestRecord(rid, prompt_len=10, output_len=output_len, arrival_time=arrival,
                         token_times=list(times), finish_time=finish, **kw)


def test_per_request_definitions_follow_vllm():
    r = record(arrival=0.5, times=(1.0, 1.5, 2.5), finish=3.0)
    assert r.ttft == pytest.approx(0.5)
    assert r.e2el == pytest.approx(2.0)
    assert r.tpot == pytest.approx((2.0 - 0.5) / 2)
    assert r.itls == pytest.approx([0.5, 1.0])
    assert r.jct == pytest.approx(2.5)            # until the client got the result
    assert record(finish=None).jct == pytest.approx(2.5)
    assert record(times=(1.0,), output_len=1).tpot is None


def test_chunked_streams_count_tokens_not_chunks():
    r = record(times=(1.0, 2.0), num_tokens=5, output_len=5)
    assert r.num_output_tokens == 5
    assert r.tpot == pytest.approx(1.0 / 4)


def test_shifted_moves_every_time():
    r = record(arrival=10.0, times=(11.0, 12.0), finish=13.0).shifted(10.0)
    assert (r.arrival_time, r.token_times, r.finish_time) == (0.0, [1.0, 2.0], 3.0)


def test_summary_throughput_latency_and_paper_metrics():
    a = record("a", 0.0, (1.0, 2.0, 4.0))                 # e2el 4, 3 tokens, max gap 2
    b = record("b", 1.0, (2.0, 2.5), output_len=2)        # e2el 1.5, 2 tokens, max gap 0.5
    failed = record("c", 0.0, (), error="boom")
    s = summarize([a, b, failed], duration_s=5.0)
    assert (s["completed"], s["failed"], s["length_mismatches"]) == (2, 1, 0)
    assert s["total_output_tokens"] == 5
    assert s["request_throughput"] == pytest.approx(0.4)
    assert s["output_throughput"] == pytest.approx(1.0)
    assert s["ttft_ms"]["mean"] == pytest.approx(1000.0)
    assert s["e2el_ms"]["median"] == pytest.approx(2750.0)
    assert s["itl_ms"]["mean"] == pytest.approx(1000.0 * (1.0 + 2.0 + 0.5) / 3)
    assert s["tpot_ms"]["mean"] == pytest.approx(1000.0 * (1.5 + 0.5) / 2)
    assert s["normalized_latency_s_per_token"] == pytest.approx((4.0 / 3 + 1.5 / 2) / 2)
    assert s["latency_bound_ms"]["max"] == pytest.approx(2000.0)
    assert s["latency_bound_ms"]["mean"] == pytest.approx(1250.0)
    assert "goodput" not in s


def test_pooled_gaps_and_bounds_match_each_request_on_its_own():
    # One-token requests (no gap) at the start, in the middle and at the end; a request whose
    # times go backwards across the boundary to the next must not lend it a gap.
    rng = random.Random(7)
    records = [record("a", 0.0, (5.0,), output_len=1)]
    for i in range(40):
        n = rng.choice([1, 2, 3, 7])
        start = rng.uniform(0.0, 100.0)
        times = [start + sum(rng.uniform(0.0, 2.0) for _ in range(k)) for k in range(n)]
        records.append(record(f"r{i}", 0.0, times, output_len=n))
    records.append(record("z", 0.0, (1.0,), output_len=1))
    s = summarize(records, duration_s=100.0)
    gaps = [g for r in records for g in r.itls]
    bounds = [max(r.itls, default=0.0) for r in records]
    assert s["itl_ms"]["mean"] == pytest.approx(1000.0 * sum(gaps) / len(gaps))
    assert s["itl_ms"]["p99"] == pytest.approx(1000.0 * float(np.percentile(gaps, 99)))
    assert s["latency_bound_ms"]["mean"] == pytest.approx(1000.0 * sum(bounds) / len(bounds))
    assert s["latency_bound_ms"]["median"] == pytest.approx(1000.0 * float(np.median(bounds)))
    assert s["latency_bound_ms"]["max"] == pytest.approx(1000.0 * max(bounds))
    one = summarize([record(times=(1.0,), output_len=1)], duration_s=1.0)
    assert one["latency_bound_ms"]["max"] == 0.0 and math.isnan(one["itl_ms"]["mean"])


def test_length_mismatch_is_counted():
    s = summarize([record(times=(1.0, 2.0), output_len=3)], duration_s=1.0)
    assert s["length_mismatches"] == 1


def test_goodput_counts_requests_meeting_every_slo():
    fast = record("f", 0.0, (0.1, 0.15, 0.2))
    slow_first = record("s", 0.0, (0.9, 0.95, 1.0))
    slos = parse_goodput(["ttft:500", "tpot:100"])
    assert meets_slos(fast, slos) and not meets_slos(slow_first, slos)
    s = summarize([fast, slow_first], duration_s=2.0, slos=slos)
    assert s["goodput"] == pytest.approx(0.5)
    assert s["slo_attainment"] == pytest.approx(0.5)


def test_empty_summary_has_no_numbers_not_zeros():
    s = summarize([record(times=(), error="x")], duration_s=1.0)
    assert s["completed"] == 0 and math.isnan(s["ttft_ms"]["mean"])
    assert math.isnan(s["normalized_latency_s_per_token"])


@pytest.mark.parametrize("items,match", [
    (["ttft"], "expected KEY:MS"), (["itl:5"], "expected KEY:MS"),
    (["e2el:fast"], "not a number"), (["tpot:0"], "must be > 0"),
])
def test_bad_goodput_is_refused(items, match):
    with pytest.raises(ValueError, match=match):
        parse_goodput(items)


def test_goodput_parses_like_vllm():
    assert parse_goodput(["ttft:500", "e2el:2000.5"]) == {"ttft": 500.0, "e2el": 2000.5}
    assert parse_goodput(None) == {}


def test_slo_satisfaction_ratio_follows_econoserve():
    slo = JctSlo(2.0, prompt_s=0.25, token_s=0.5)      # limit 2 x (0.25 + 0.5 l)
    assert slo.limit_s(3) == pytest.approx(3.5)
    on_time = record("a", 0.0, (1.0, 2.0, 3.5))          # JCT 3.5 <= 3.5
    late = record("b", 0.0, (1.0, 2.0, 3.0), finish=3.6)  # the client saw it at 3.6
    short = record("c", 1.0, (1.5,), output_len=1)       # JCT 0.5 <= 2 x 0.75
    failed = record("d", 0.0, (), error="boom")           # never meets it
    records = [on_time, late, short, failed]
    assert slo_satisfaction_ratio(records, slo) == pytest.approx(0.5)
    s = summarize(records, duration_s=4.0, jct_slo=slo)
    assert s["slo_satisfaction_ratio"] == pytest.approx(0.5)
    assert s["jct_slo"] == pytest.approx({"scale": 2.0, "tp_ms": 250.0, "tg_ms": 500.0})
    assert "slo_satisfaction_ratio" not in summarize(records, 4.0, jct_slo=JctSlo(2.0))


def test_jct_slo_reference_is_mean_ttft_and_tpot():
    a = record("a", 0.0, (1.0, 2.0, 3.0))                # ttft 1, tpot 1
    b = record("b", 0.0, (3.0, 3.5, 4.0))                # ttft 3, tpot 0.5
    slo = JctSlo(2.0).with_reference([a, b, record("c", times=(), error="x")])
    assert (slo.prompt_s, slo.token_s) == pytest.approx((2.0, 0.75))
    assert JctSlo(1.0, 0.1, 0.2).with_reference([a]) == JctSlo(1.0, 0.1, 0.2)
    with pytest.raises(ValueError, match="reference run"):
        JctSlo(2.0).with_reference([record("c", times=(), error="x")])


def test_jct_slo_parses_scale_or_scale_tp_tg():
    assert parse_jct_slo(None) is None
    assert parse_jct_slo("2") == JctSlo(2.0)
    assert parse_jct_slo("2:40:25") == JctSlo(2.0, 0.04, 0.025)
    for bad in ("2:40", "0", "x", "2:40:-1"):
        with pytest.raises(ValueError, match="--jct-slo"):
            parse_jct_slo(bad)


def test_shifting_a_record_keeps_its_prediction():
    rec = RequestRecord("r", 4, 3, 10.0, [10.5, 10.6, 10.7], 10.8, None,
                        predicted_len=7, prediction_source="retrieval")
    moved = rec.shifted(10.0)
    assert (moved.predicted_len, moved.prediction_source) == (7, "retrieval")
    assert moved.arrival_time == 0.0 and moved.finish_time == pytest.approx(0.8)
    assert moved.token_times == pytest.approx([0.5, 0.6, 0.7])
