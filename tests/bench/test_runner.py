"""Real-time replay: arrivals are honoured and waiting for a busy backend counts as latency."""
from __future__ import annotations

import pytest

from lenserve.bench.runner import RunnerConfig, replay, warm_up

from .fakes import SerialBackend, make_workload

QUIET = RunnerConfig(show_progress=False)


def test_requests_are_submitted_at_their_arrival_times():
    backend = SerialBackend()
    run = replay(backend, make_workload([0.0, 0.05, 0.15]), QUIET, request_rate=20.0)
    start = backend.submitted[0][1]           # offset 0 arrives at the run's start
    for (rid, arrival, wall), offset in zip(backend.submitted, [0.0, 0.05, 0.15]):
        assert arrival == pytest.approx(start + offset)
        assert wall >= arrival                 # never early
        assert wall - arrival < 0.25           # and not much late while idle (loaded CI hosts)
    assert [r.request_id for r in run.records] == ["req-0", "req-1", "req-2"]
    assert [r.arrival_time for r in run.records] == pytest.approx([0.0, 0.05, 0.15])
    assert run.request_rate == 20.0 and run.duration_s >= 0.15


def test_waiting_for_a_busy_backend_is_charged_to_the_request():
    # Both arrive at once; the second waits for the first's three 30 ms tokens.
    run = replay(SerialBackend(step_s=0.03), make_workload([0.0, 0.0]), QUIET)
    first, second = run.records
    # Lower bounds only: sleeps guarantee them, while a loaded machine may stretch any step.
    assert first.ttft >= 0.03 - 0.005
    assert second.ttft >= first.e2el + 0.03 - 0.005
    assert second.e2el > first.e2el


def test_failed_requests_come_back_as_records():
    run = replay(SerialBackend(fail_ids={"req-1"}), make_workload([0.0, 0.0, 0.0]), QUIET)
    assert [r.success for r in run.records] == [True, False, True]
    assert run.records[1].error == "refused"


def test_warm_up_runs_short_untimed_requests_and_reports_failure():
    backend = SerialBackend()
    warm_up(backend, make_workload([0.0, 1.0, 2.0], output_len=50), QUIET)
    assert [s[0] for s in backend.submitted] == ["warmup-0", "warmup-1"]
    with pytest.raises(RuntimeError, match="failed its warm-up request: refused"):
        warm_up(SerialBackend(fail_ids={"warmup-0"}), make_workload([0.0]), QUIET)
