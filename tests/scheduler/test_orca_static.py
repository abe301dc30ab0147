from sched_helpers import add, make_request, make_scheduler, scheduled, step

from services.scheduler.request import RequestStatus


def test_orca_reserves_prompt_plus_max_tokens_on_admission():
    s = make_scheduler("orca")
    (a,) = add(s, make_request("a", 4, max_tokens=8))
    step(s)
    assert s.block_manager.num_blocks_of("a") == 3          # 12 tokens in blocks of 4
    for _ in range(7):
        step(s)
    assert s.block_manager.num_free_blocks == 64 and a.num_output_tokens == 8


def test_orca_admission_stops_when_reservations_fill_the_pool_and_never_preempts():
    s = make_scheduler("orca", num_gpu_blocks=6, max_model_len=24)
    _a, _b, c = add(s, *(make_request(x, 4, max_tokens=8) for x in "abc"))
    out, _ = step(s)
    assert scheduled(out) == {"a": 4, "b": 4} and c.status is RequestStatus.WAITING
    for _ in range(7):
        out, _ = step(s)
        assert not out.preempted
    out, _ = step(s)                          # a and b finished at 8 tokens; c joins now
    assert scheduled(out) == {"c": 4}


def test_orca_fixed_batch_size_and_iteration_level_joining():
    s = make_scheduler("orca", max_num_seqs=2)
    _a, _b, _c = add(s, make_request("a", 4, 1), make_request("b", 4, 5), make_request("c", 4, 5))
    out, _ = step(s)
    assert set(scheduled(out)) == {"a", "b"}  # a finishes on its first token
    out, _ = step(s)
    assert scheduled(out) == {"b": 1, "c": 4}  # c joins while b is mid-generation


def test_orca_runs_prompts_whole():
    s = make_scheduler("orca", max_num_batched_tokens=8)
    add(s, make_request("a", 20))
    out, _ = step(s)
    assert scheduled(out) == {"a": 20}


def test_orca_reservation_is_capped_at_the_context_length():
    s = make_scheduler("orca", num_gpu_blocks=8, max_model_len=32)
    (a,) = add(s, make_request("a", 4, max_tokens=100))
    step(s)
    assert s.block_manager.num_free_blocks == 0
    while s.has_unfinished_requests():
        out, _ = step(s)
        assert not out.preempted
    assert a.finish_reason.value == "length" and a.num_tokens == 32


def test_static_batch_runs_until_all_its_requests_finish():
    s = make_scheduler("static", max_num_seqs=2)
    _a, b, c = add(s, make_request("a", 4, 1), make_request("b", 4, 4), make_request("c", 4, 2))
    out, _ = step(s)
    assert set(scheduled(out)) == {"a", "b"}
    for _ in range(3):
        out, _ = step(s)
        assert scheduled(out) == {"b": 1}      # a's slot stays idle; c waits
    assert b.is_finished and c.status is RequestStatus.WAITING
    out, _ = step(s)
    assert scheduled(out) == {"c": 4}
