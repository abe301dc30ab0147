"""The cost-model executor reads the scheduler's plan (``execute_scheduled``) instead of an
``ExecutorInput``: it must time and sample exactly as it would from the input."""
import pytest

from lenserve.bench.simulation import simulate
from services.scheduler.request import RequestStatus
from services.simulator.cost_model import LinearCostModel
from services.simulator.executor import SimExecutor, VirtualClock
from services.simulator.features import from_input, from_scheduled
from tests.scheduler.sched_helpers import add, make_request, make_scheduler
from tests.simulator.sim_helpers import SHAPE, make_spec, make_target, workload

# Every feature costs something, so a wrong count changes the time.
COST = LinearCostModel(1e-3, (1e-4, 3e-5, 1e-8, 1e-7))


def _executor() -> SimExecutor:
    return SimExecutor(SHAPE, COST, VirtualClock(), num_gpu_blocks=64, block_size=4)


def test_plan_and_input_give_the_same_features_samples_and_times():
    # Prompt chunks (a 12-token budget splits the prompts), decodes and admissions mixed.
    s = make_scheduler(max_num_batched_tokens=12)
    add(s, make_request("a", 10, 6), make_request("b", 3, 9), make_request("c", 17, 4))
    by_input, by_plan = _executor(), _executor()
    iterations = 0
    while s.has_unfinished_requests():
        out = s.schedule(float(iterations))
        features, ids = from_scheduled(out.scheduled)
        batch = s.make_executor_input(out)
        assert features == from_input(batch)
        assert ids == [seq.request_id for seq in batch.sequences if seq.sample]
        expected = by_input.execute(batch)
        result = by_plan.execute_scheduled(out.iteration, out.scheduled)
        assert list(result.sampled.items()) == list(expected.sampled.items())
        assert result.timings == expected.timings
        s.update_from_output(out, result, float(iterations))
        iterations += 1
    assert iterations > 5 and by_plan.clock.now == by_input.clock.now > 0


def test_attended_pairs_are_summed_exactly():
    s = make_scheduler(num_gpu_blocks=2048, max_model_len=4096, max_num_batched_tokens=4096)
    add(s, *(make_request(f"r{i}", 1000 + 37 * i, 3) for i in range(3)))
    out = s.schedule(0.0)
    assert from_scheduled(out.scheduled)[0] == from_input(s.make_executor_input(out))


def test_the_plan_is_read_not_changed():
    s = make_scheduler()
    (a,) = add(s, make_request("a", 6, 3))
    out = s.schedule(0.0)
    _executor().execute_scheduled(out.iteration, out.scheduled)
    assert (a.num_computed_tokens, a.num_tokens, a.status) == (0, 6, RequestStatus.RUNNING)


@pytest.mark.parametrize("policy", ["vllm", "alise", "econoserve", "fluidinfer", "sarathi"])
def test_a_run_is_the_same_through_the_executor_input(policy, monkeypatch):
    requests = [(20, 30, 0.0), (9, 12, 0.01), (20, 30, 0.02), (4, 2, 0.03), (31, 7, 0.05),
                (12, 25, 0.3), (6, 3, 0.31)]
    spec = make_spec(policy, make_target(COST, num_gpu_blocks=24, block_size=4),
                     max_model_len=64)
    by_plan = simulate(spec, workload(*requests), 5.0, show_progress=False)
    monkeypatch.delattr(SimExecutor, "execute_scheduled")
    by_input = simulate(spec, workload(*requests), 5.0, show_progress=False)
    assert [r.to_json() for r in by_plan.records] == [r.to_json() for r in by_input.records]
    assert by_plan.duration_s == by_input.duration_s
