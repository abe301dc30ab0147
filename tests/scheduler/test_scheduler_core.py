import random

import pytest
from sched_helpers import add, make_request, make_scheduler, scheduled, step

from lenserve_contract.sampling_params import InvalidRequestError
from services.scheduler.policies import POLICIES
from services.scheduler.policies.vllm import VllmPolicy
from services.scheduler.request import FinishReason, RequestStatus


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_random_workload_keeps_block_accounting_consistent(policy):
    rng = random.Random(policy)
    s = make_scheduler(policy, num_gpu_blocks=24, max_model_len=64, max_num_batched_tokens=24)
    requests, t = [], 0
    while s.has_unfinished_requests() or len(requests) < 40:
        if len(requests) < 40 and rng.random() < 0.5:
            r = make_request(f"r{len(requests)}", rng.randint(1, 30), rng.randint(1, 20))
            requests.append(add(s, r)[0])
        if rng.random() < 0.03 and s.state.requests:
            s.abort_request(rng.choice(sorted(s.state.requests)))
        step(s, now=float(t))                 # step() calls check_integrity()
        t += 1
        assert t < 5000, "workload did not drain"
    done = [r for r in requests if r.finish_reason is not FinishReason.ABORT]
    assert done and all(r.num_output_tokens == r.sampling_params.max_tokens for r in done)
    assert s.block_manager.num_free_blocks == 24
    if policy == "vllm":
        assert s.stats().num_preemptions > 0   # the small pool must have forced some


def test_bad_requests_are_refused_and_change_nothing():
    s = make_scheduler(max_model_len=32)
    add(s, make_request("a", 4))
    before = s.stats()
    cases = [(make_request("a", 4), "request_id", "invalid_argument"),
             (make_request("e", 0), "prompt", "invalid_argument"),
             (make_request("long", 32), "prompt", "prompt_too_long")]
    for request, field, code in cases:
        with pytest.raises(InvalidRequestError) as err:
            s.add_request(request)
        assert (err.value.field, err.value.code) == (field, code)
    assert s.stats() == before
    step(s)
    assert s.state.requests["a"].num_output_tokens == 1


def test_abort_frees_blocks_of_running_and_waiting_requests():
    s = make_scheduler(max_num_seqs=1)
    _a, _b = add(s, make_request("a", 8), make_request("b", 8))
    step(s)
    assert s.abort_request("b").status is RequestStatus.FINISHED_ABORTED
    assert s.abort_request("a").finish_reason is FinishReason.ABORT
    assert s.abort_request("a") is None
    assert s.block_manager.num_free_blocks == 64 and not s.has_unfinished_requests()
    assert len(s.policy.waiting) == 0


def test_stop_conditions():
    s = make_scheduler(max_model_len=8)
    eos = make_request("eos", 2, 5)
    eos.sampling_params.ignore_eos = False
    eos.eos_token_id = 7                      # the synthetic executor always samples 7
    stop_id = make_request("stop_id", 2, 5)
    stop_id.sampling_params.stop_token_ids = [7]
    stop_id.sampling_params.min_tokens = 2
    ctx = make_request("ctx", 6, 50)
    add(s, eos, stop_id, ctx)
    while s.has_unfinished_requests():
        step(s)
    assert (eos.finish_reason, eos.num_output_tokens) == (FinishReason.STOP, 1)
    assert (stop_id.finish_reason, stop_id.stop_reason, stop_id.num_output_tokens) == (
        FinishReason.STOP, 7, 2)
    assert (ctx.finish_reason, ctx.num_tokens) == (FinishReason.LENGTH, 8)


def test_metrics_come_from_the_clock_passed_in():
    s = make_scheduler(max_num_batched_tokens=4)
    (a,) = add(s, make_request("a", 6, 2))
    for now in (1.0, 2.0, 3.0):
        step(s, now)
    m = a.metrics
    assert (m.first_scheduled_time, m.first_token_time, m.token_times, m.finished_time) == (
        1.0, 2.0, [2.0, 3.0], 3.0)


class SwapOncePolicy(VllmPolicy):
    """vLLM, except that on iteration 2 the first running request is swapped out, and it is
    swapped back in two iterations later."""

    name = "swap-once"

    def schedule(self, state, budget):
        if state.iteration == 2:
            output = state.new_output()
            victim = next(iter(state.running.values()))
            assert state.swap_out(victim, output)
            self.parked = victim
            return output
        if state.iteration == 4:
            output = state.new_output()
            assert state.swap_in(self.parked, output)
            return output
        return super().schedule(state, budget)


def test_swap_out_keeps_computed_tokens_and_swap_in_restores_blocks():
    s = make_scheduler(num_host_blocks=8)
    s.policy = SwapOncePolicy(s.config)
    a, _b = add(s, make_request("a", 6), make_request("b", 6))
    step(s)
    step(s)
    out, _ = step(s)                          # iteration 2: swap out
    assert out.swapped_out[0][0] == "a" and len(out.swapped_out[0][1]) == 2
    assert a.status is RequestStatus.SWAPPED and a.num_computed_tokens == 7
    assert s.stats().num_preempted == 1 and s.block_manager.num_blocks_of("a") == 0
    assert s.stats().num_free_host_blocks == 6
    step(s)
    out, _ = step(s)                          # iteration 4: swap in
    assert [rid for rid, _ in out.swapped_in] == ["a"] and a.status is RequestStatus.RUNNING
    out, _ = step(s)
    assert scheduled(out) == {"a": 1, "b": 1}


def test_a_full_host_tier_refuses_the_swap_and_nothing_changes():
    s = make_scheduler(num_host_blocks=1)
    a, = add(s, make_request("a", 6))
    step(s)
    out = s.state.new_output()
    assert not s.state.swap_out(a, out)
    assert out.swap_refusals and "1 free blocks, 2 needed" in out.swap_refusals[0][1]
    assert a.status is RequestStatus.RUNNING and not out.swapped_out
    s.check_integrity()


def test_block_tables_travel_as_deltas_and_whole_after_a_rewrite():
    s = make_scheduler()
    a, = add(s, make_request("a", 4, max_tokens=12))
    _, batch = step(s)
    seq = batch.sequences[0]
    assert not seq.block_table_is_delta and seq.block_table == [0]
    _, batch = step(s)                       # the 5th token needs a second block
    seq = batch.sequences[0]
    assert seq.block_table_is_delta and seq.block_table == [1]
    _, batch = step(s)
    assert batch.sequences[0].block_table_is_delta and batch.sequences[0].block_table == []
    s.abort_request("a")
    b, = add(s, make_request("b", 2))
    _, batch = step(s)
    assert batch.finished_request_ids == ["a"]
    assert not batch.sequences[0].block_table_is_delta


def test_whole_tables_are_resent_after_the_executor_lost_them():
    s = make_scheduler()
    add(s, make_request("a", 4, max_tokens=12))
    step(s)
    _, batch = step(s)
    assert batch.sequences[0].block_table_is_delta
    s.resend_block_tables()
    _, batch = step(s)
    assert not batch.sequences[0].block_table_is_delta and batch.sequences[0].block_table == [0, 1]
