"""The simulator runs the real serving core and policies; only the executor is a cost model."""
import pytest

from lenserve.bench.backends.base import trace_params
from lenserve.bench.metrics import summarize
from lenserve.bench.simulation import build_engine, simulate
from services.scheduler.policies import POLICIES
from services.simulator.cost_model import LinearCostModel
from services.simulator.executor import VirtualClock
from tests.engine.engine_helpers import make_engine
from tests.simulator.sim_helpers import constant_cost, make_spec, make_target, workload


def test_the_engine_holds_the_real_policy_object():
    for policy in ("vllm", "orca", "sarathi"):
        engine = build_engine(make_spec(policy), VirtualClock())
        assert type(engine.scheduler.policy) is POLICIES[policy]


def test_virtual_time_advances_by_modelled_costs():
    run = simulate(make_spec(), workload((8, 5, 0.5)), 1.0, show_progress=False)
    (record,) = run.records
    # Arrives at 0.5; the whole prompt is one iteration, then one token per 10 ms iteration.
    assert record.token_times == pytest.approx([0.51, 0.52, 0.53, 0.54, 0.55])
    assert run.duration_s == pytest.approx(0.55)


def test_cost_depends_on_the_batch():
    cost = LinearCostModel(0.001, (0.001, 0.0, 0.0))   # 1 ms + 1 ms per fed token
    run = simulate(make_spec(target=make_target(cost)), workload((10, 2, 0.0)), 1.0, False)
    assert run.records[0].token_times == pytest.approx([0.011, 0.013])


def _finish_order_real(policy: str, requests) -> list[str]:
    engine = make_engine(policy, num_gpu_blocks=24, block_size=4, max_model_len=64)
    for i, (p, o, _) in enumerate(requests):
        engine.add_request(f"req-{i}", prompt_token_ids=[65 + (i + j) % 26 for j in range(p)],
                           sampling_params=trace_params(64), true_output_len=o)
    order = []
    while engine.has_unfinished_requests():
        order += [out.request_id for out in engine.step() if out.finished]
    return order


@pytest.mark.parametrize("policy", ["vllm", "orca", "sarathi", "econoserve", "fluidinfer",
                                    "alise-fluid"])
def test_same_order_as_the_real_engine(policy):
    # A short request queued behind long ones, on a pool too small for all of them.
    requests = [(20, 30, 0.0), (20, 30, 0.0), (20, 30, 0.0), (4, 2, 0.0)]
    spec = make_spec(policy, make_target(num_gpu_blocks=24, block_size=4), max_model_len=64)
    run = simulate(spec, workload(*requests), float("inf"), show_progress=False)
    assert all(r.success for r in run.records)
    by_finish = sorted(run.records, key=lambda r: (r.token_times[-1], r.request_id))
    assert [r.request_id for r in by_finish] == _finish_order_real(policy, requests)


def test_requests_that_cannot_fit_are_failed_records():
    spec = make_spec(target=make_target(num_gpu_blocks=8, block_size=4), max_model_len=128)
    run = simulate(spec, workload((8, 4, 0.0), (20, 20, 0.1), (40, 1, 0.2)), 1.0, False)
    ok, too_long, prompt_too_long = run.records
    assert ok.success and not too_long.success and not prompt_too_long.success
    assert "simulated engine holds 32" in too_long.error
    assert summarize(run.records, run.duration_s)["failed"] == 2


def test_same_seed_same_summary():
    reqs = [(5 + 7 * i % 30, 3 + 11 * i % 40, 0.02 * i) for i in range(40)]
    cost = LinearCostModel(0.002, (1e-4, 5e-4, 1e-7))
    spec = make_spec("vllm", make_target(cost, num_gpu_blocks=40), predictor="oracle")
    a = simulate(spec, workload(*reqs), 50.0, False)
    b = simulate(spec, workload(*reqs), 50.0, False)
    assert summarize(a.records, a.duration_s) == summarize(b.records, b.duration_s)
    assert a.duration_s > 0


def test_idle_engine_jumps_to_the_next_arrival():
    run = simulate(make_spec(target=make_target(constant_cost(0.01))),
                   workload((4, 2, 0.0), (4, 2, 100.0)), 1.0, False)
    assert run.records[1].token_times[0] == pytest.approx(100.01)


def test_runs_report_kv_use_scheduler_time_and_the_longest_wait():
    # Two 30-token prompts on a 10-block pool: the second waits for the first to finish.
    spec = make_spec("vllm", make_target(constant_cost(0.01), num_gpu_blocks=10), max_model_len=40)
    run = simulate(spec, workload((30, 8, 0.0), (30, 8, 0.0)), 1.0, False)
    stats = run.stats
    assert 0.5 < stats["kv_allocated_util"] <= 1.0
    assert 0.0 < stats["kv_used_util"] <= stats["kv_allocated_util"]
    assert stats["schedule_ms_per_iteration"] > 0 and 0 < stats["schedule_share"] < 1
    summary = summarize(run.records, run.duration_s)
    waits = sorted(r.ttft for r in run.records)
    assert summary["max_ttft_ms"] == pytest.approx(waits[-1] * 1000) and waits[-1] > 0.05


def test_vllm_v0_reports_its_allocation_failures():
    # Three requests that each grow to 10 blocks on a 20-block pool: decodes run out of
    # blocks and preempt; on a 40-block pool none does.
    reqs = [(8, 32, 0.0), (8, 32, 0.0), (8, 32, 0.0)]
    for blocks, failing in ((20, True), (40, False)):
        spec = make_spec("vllm-v0", make_target(constant_cost(0.01), num_gpu_blocks=blocks))
        stats = simulate(spec, workload(*reqs), 1.0, False).stats
        assert (stats["num_allocation_failures"] > 0) is failing
        assert (stats["allocation_failure_share"] > 0) is failing
        assert stats["allocation_failure_share"] <= 1.0


def test_econoserve_reports_the_kv_it_lends_to_guests():
    # A long GT runs alone on a pool its exact allocation nearly fills; a short request
    # arrives later and, prefilled, fits no free KV but the long one's unused second half.
    reqs = [(8, 200, 0.0), (8, 8, 0.5)]
    stats = {}
    for pipelining in ("true", "false"):
        spec = make_spec("econoserve", make_target(constant_cost(0.01), num_gpu_blocks=54),
                         max_model_len=256, predictor="oracle", policy_config=(
                             f"enable_pipelining={pipelining}", "padding_ratio=0",
                             "lend_scope=host"))
        run = simulate(spec, workload(*reqs), 1.0, False)
        assert all(r.success for r in run.records)
        stats[pipelining] = (run.stats, run.records[1].token_times[-1])
    (lent, short_done), (unlent, short_late) = stats["true"], stats["false"]
    assert lent["num_hosted"] == 1 and lent["kv_lent_util"] > 0
    assert unlent["num_hosted"] == 0 and "kv_lent_util" not in unlent
    assert short_done < 1.0 < short_late      # hosted at once, not after the long one
