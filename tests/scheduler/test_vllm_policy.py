import pytest
from sched_helpers import add, make_request, make_scheduler, scheduled, step

from services.scheduler.request import RequestStatus


def test_token_budget_chunks_a_long_prompt_and_samples_only_at_its_end():
    s = make_scheduler(max_num_batched_tokens=8)
    (a,) = add(s, make_request("a", 20))
    chunks = []
    for _ in range(3):
        out, batch = step(s)
        chunks.append((scheduled(out)["a"], batch.sequences[0].sample))
    assert chunks == [(8, False), (8, False), (4, True)]
    assert a.num_output_tokens == 1 and a.num_computed_tokens == 20


def test_running_decodes_are_scheduled_before_waiting_prefills():
    s = make_scheduler(max_num_batched_tokens=8)
    add(s, make_request("a", 4))
    step(s)
    add(s, make_request("b", 20))
    out, _ = step(s)
    assert scheduled(out) == {"a": 1, "b": 7}
    assert out.num_batched_tokens == 8


def test_budget_is_shared_in_fcfs_order():
    s = make_scheduler(max_num_batched_tokens=8)
    add(s, make_request("a", 6), make_request("b", 6), make_request("c", 6))
    out, _ = step(s)
    assert scheduled(out) == {"a": 6, "b": 2}


def test_max_num_seqs_limits_admission():
    s = make_scheduler(max_num_seqs=2)
    add(s, *(make_request(f"r{i}", 2) for i in range(3)))
    out, _ = step(s)
    assert list(scheduled(out)) == ["r0", "r1"]
    assert s.stats().num_waiting == 1


def test_preemption_victim_is_the_most_recently_admitted_and_goes_to_the_front():
    # 4 blocks of 4 tokens: three 4-token prompts fill 3; the first decode takes the last.
    s = make_scheduler(num_gpu_blocks=4, max_model_len=16)
    _a, _b, c = add(s, make_request("a", 4), make_request("b", 4), make_request("c", 4))
    d = make_request("d", 4)
    step(s)
    add(s, d)
    out, _ = step(s)
    assert [r.request_id for r in out.preempted] == ["c"]
    assert scheduled(out) == {"a": 1, "b": 1}
    assert c.status is RequestStatus.PREEMPTED and c.num_computed_tokens == 0
    assert c.num_output_tokens == 1                      # its output survives the preemption
    assert list(s.policy.waiting) == [c, d]
    assert s.block_manager.num_blocks_of("c") == 0


def test_a_request_that_cannot_grow_preempts_itself_when_it_is_last():
    s = make_scheduler(num_gpu_blocks=5, max_model_len=20)
    _a, _b, c = add(s, make_request("a", 4), make_request("b", 4), make_request("c", 4))
    step(s)
    out, _ = step(s)
    assert out.preempted == [c] and scheduled(out) == {"a": 1, "b": 1}


def test_no_admission_in_a_step_that_preempted():
    s = make_scheduler(num_gpu_blocks=5, max_model_len=20)
    add(s, make_request("a", 4), make_request("b", 4), make_request("c", 4))
    step(s)
    (d,) = add(s, make_request("d", 1))
    out, _ = step(s)
    assert out.preempted and s.block_manager.num_free_blocks == 1   # d would fit ...
    assert "d" not in scheduled(out) and d.status is RequestStatus.WAITING   # ... but waits


@pytest.mark.parametrize("caching, fed", [(False, 5), (True, 1)])
def test_preempted_request_is_recomputed_with_its_outputs_and_finishes(caching, fed):
    s = make_scheduler(num_gpu_blocks=4, max_model_len=16, enable_prefix_caching=caching)
    a, b, c = add(s, make_request("a", 4, 3), make_request("b", 4, 3), make_request("c", 4, 3))
    step(s)
    step(s)                                   # c preempted with 1 output token
    recompute = None
    for _ in range(10):
        out, _batch = step(s)
        if "c" in scheduled(out) and recompute is None:
            recompute = scheduled(out)["c"]
    # Prompt 4 + 1 output prefilled again; with caching the prompt's full block is still
    # cached (its KV was kept when c was preempted), so only the output token is fed.
    assert recompute == fed
    assert all(r.num_output_tokens == 3 for r in (a, b, c))
    assert not s.has_unfinished_requests()


def test_without_chunking_an_oversized_prompt_runs_whole_and_alone():
    s = make_scheduler(max_num_batched_tokens=8, enable_chunked_prefill=False)
    add(s, make_request("a", 2), make_request("big", 12), make_request("c", 2))
    out, _ = step(s)
    assert scheduled(out) == {"a": 2}         # big does not fit beside a; FCFS keeps c behind
    s.abort_request("a")
    out, _ = step(s)
    assert scheduled(out) == {"big": 12}
