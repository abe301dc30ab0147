"""The side-by-side table, strict JSON with per-request records, and the sweep figure."""
from __future__ import annotations

import json
import math

import pytest

from lenserve.bench.metrics import RequestRecord
from lenserve.bench.report import format_report, plot_normalized_latency, summarize_runs, write_json
from lenserve.bench.runner import BackendRun


def run(backend, rate, scale=1.0):
    records = [RequestRecord("r0", 4, 2, 0.0, [0.1 * scale, 0.3 * scale], 0.3 * scale),
               RequestRecord("r1", 4, 2, 0.0, [], error="failed")]
    return BackendRun(backend, rate, 1.0, records)


def test_table_puts_backends_side_by_side():
    results = summarize_runs([run("lenserve:vllm", math.inf), run("hf-cb", math.inf, 2.0)], {})
    text = format_report(results)
    header = next(line for line in text.splitlines() if "request rate" in line)
    assert "lenserve:vllm" in header and "hf-cb" in header and "inf" in header
    ttft = next(line for line in text.splitlines() if line.startswith("Mean TTFT"))
    assert ttft.split()[-2:] == ["100.00", "200.00"]
    assert "Goodput" not in text                       # no SLOs given
    assert "Goodput" in format_report(summarize_runs([run("a", 1.0)], {"ttft": 150.0}))


def test_one_table_per_rate():
    results = summarize_runs([run("a", 1.0), run("a", 2.0)], {})
    assert format_report(results).count("request rate") == 2


def test_json_is_strict_and_holds_requests(tmp_path):
    runs = [run("a", math.inf)]
    path = tmp_path / "r.json"
    write_json(path, {"num_prompts": 2}, summarize_runs(runs, {}), runs)

    def refuse(constant):
        raise AssertionError(f"non-standard JSON constant {constant}")

    data = json.loads(path.read_text(), parse_constant=refuse)
    (entry,) = data["runs"]
    assert entry["request_rate"] == "inf" and entry["backend"] == "a"
    assert [r["request_id"] for r in entry["requests"]] == ["r0", "r1"]
    assert entry["requests"][0]["ttft"] == 0.1 and entry["requests"][1]["error"] == "failed"
    assert data["config"] == {"num_prompts": 2}


def test_json_keeps_each_record_on_one_line_and_non_finite_times_strict(tmp_path):
    odd = RequestRecord("r2", 4, 3, 0.0, [0.1, math.nan, math.inf], 0.4, error="odd clock")
    runs = [run("a", 1.0), BackendRun("b", 2.0, 1.0, [odd, *run("b", 2.0).records]),
            BackendRun("c", 3.0, 1.0, [])]
    path = tmp_path / "r.json"
    write_json(path, {"note": "@requests-x@"}, summarize_runs(runs, {}), runs)
    text = path.read_text()
    data = json.loads(text, parse_constant=lambda c: pytest.fail(f"constant {c} written"))
    assert [len(e["requests"]) for e in data["runs"]] == [2, 3, 0]
    assert data["runs"][1]["requests"][0]["token_times"] == [0.1, None, "inf"]
    assert data["runs"][0]["requests"][0] == run("a", 1.0).records[0].to_json()
    assert data["config"] == {"note": "@requests-x@"}
    records = [json.loads(line.rstrip(",")) for line in text.splitlines()
               if line.startswith('{"request_id"')]
    assert records == [r for e in data["runs"] for r in e["requests"]]


def test_sweep_figure_is_a_png(tmp_path):
    results = summarize_runs([run(b, r, r) for b in ("a", "b") for r in (1.0, 2.0, 4.0)], {})
    path = tmp_path / "sweep.png"
    plot_normalized_latency(path, results)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_jct_slo_reference_is_the_first_backend_at_its_lowest_rate():
    from lenserve.bench.metrics import JctSlo

    runs = [run("a", 2.0, 3.0), run("a", 1.0), run("b", 0.5, 9.0)]
    runs[1].stats = {"num_preemptions": 4}
    results = summarize_runs(runs, {}, JctSlo(2.0))
    # a @ 1 req/s: TTFT 0.1 s, TPOT 0.2 s; r0's limit 2 x (0.1 + 0.2 x 2) = 1 s.
    assert [r["summary"]["jct_slo"]["tp_ms"] for r in results] == [100.0] * 3
    assert [r["summary"]["slo_satisfaction_ratio"] for r in results] == [0.5, 0.5, 0.0]
    assert results[1]["summary"]["num_preemptions"] == 4
    text = format_report(results)
    assert "SLO satisfaction ratio (%)" in text and "Preemptions" in text


def test_json_without_records_keeps_the_summaries(tmp_path):
    runs = [run("a", 1.0), run("b", 2.0)]
    path = tmp_path / "r.json"
    write_json(path, {}, summarize_runs(runs, {}), runs, records=False)
    data = json.loads(path.read_text())
    assert [e["requests"] for e in data["runs"]] == [[], []]
    assert all(e["summary"]["completed"] for e in data["runs"])
