import pytest
from sched_helpers import add, make_request, make_scheduler, scheduled, step

from services.scheduler.request import RequestStatus
from services.simulator.shapes import MODEL_SHAPES


def v0(mode: str | None = None, **overrides):
    options = () if mode is None else (f"preemption_mode={mode}",)
    # The factory's prompts share their first tokens: without the prefix cache, so that each
    # prompt's batch is its whole length (the cache is covered in test_prefix_caching).
    overrides.setdefault("enable_prefix_caching", False)
    return make_scheduler("vllm-v0", policy_config=options, **overrides)


def test_batches_are_prefill_first_and_never_mix_prefills_with_decodes():
    s = v0(max_num_batched_tokens=64)
    add(s, make_request("a", 4))
    step(s)
    add(s, make_request("b", 20))
    out, _ = step(s)
    assert scheduled(out) == {"b": 20}          # a's decode waits for the prefill batch
    out, _ = step(s)
    assert scheduled(out) == {"a": 1, "b": 1}


def test_prompts_are_never_chunked_and_an_oversized_one_runs_alone():
    s = v0(max_num_batched_tokens=8)
    add(s, make_request("a", 2), make_request("big", 12), make_request("c", 2))
    out, _ = step(s)
    assert scheduled(out) == {"a": 2}           # big does not fit beside a; FCFS keeps c behind
    s.abort_request("a")
    out, _ = step(s)
    assert scheduled(out) == {"big": 12}


def test_default_preemption_recomputes_the_latest_admitted_and_requeues_it_first():
    # 4 blocks of 4 tokens: three 4-token prompts fill 3, then d (prefill first) the last.
    s = v0(num_gpu_blocks=4, max_model_len=16)
    assert s.policy.options.preemption_mode == "recompute"
    _a, _b, c = add(s, make_request("a", 4), make_request("b", 4), make_request("c", 4))
    step(s)
    (d,) = add(s, make_request("d", 4))
    out, _ = step(s)
    assert scheduled(out) == {"d": 4}
    out, _ = step(s)                            # a and b each need a block: d, then c, go
    assert [r.request_id for r in out.preempted] == ["d", "c"]
    assert scheduled(out) == {"a": 1, "b": 1}
    assert c.status is RequestStatus.PREEMPTED and c.num_computed_tokens == 0
    assert list(s.policy.waiting) == [c, d]
    assert s.policy.num_allocation_failures == 2


def test_swap_mode_keeps_the_victims_kv_on_the_host_and_admits_no_prompt_meanwhile():
    s = v0("swap", num_gpu_blocks=4, max_model_len=16, num_host_blocks=8)
    a, b, c = add(s, make_request("a", 4, 6), make_request("b", 4, 6), make_request("c", 4, 6))
    step(s)
    out, _ = step(s)            # a takes the free block; b's comes from c, copied out first
    assert [rid for rid, _ in out.swapped_out] == ["c"] and not out.preempted
    assert scheduled(out) == {"a": 1, "b": 1}   # as in V0: the copy runs before the forward
    assert c.status is RequestStatus.SWAPPED and c.num_computed_tokens == 4   # its prompt KV kept
    (d,) = add(s, make_request("d", 4, 2))
    seen_d_before_c_back = False
    while s.has_unfinished_requests():
        out, _ = step(s)
        if "d" in scheduled(out) and c.status is RequestStatus.SWAPPED:
            seen_d_before_c_back = True
    assert not seen_d_before_c_back             # no prompt admitted while c was swapped
    assert c.num_preemptions >= 1 and all(r.num_output_tokens == 6 for r in (a, b, c))
    assert d.num_output_tokens == 2
    assert s.stats().num_preemptions == sum(r.num_preemptions for r in (a, b, c, d))


def test_swap_mode_without_room_on_the_host_recomputes():
    s = v0("swap", num_gpu_blocks=4, max_model_len=16, num_host_blocks=0)
    _a, _b, c = add(s, make_request("a", 4), make_request("b", 4), make_request("c", 4))
    step(s)
    out, _ = step(s)
    assert out.preempted == [c] and not out.swapped_out


def test_admission_leaves_the_watermark_free():
    for watermark, admitted in ((0.1, False), (0.05, True)):
        s = make_scheduler("vllm-v0", num_gpu_blocks=100, max_model_len=400,
                           policy_config=(f"watermark={watermark}",))
        (a,) = add(s, make_request("a", 4 * 95))    # 95 blocks leave 5 free
        out, _ = step(s)
        assert bool(out.scheduled) is admitted


def test_bad_options_are_refused():
    with pytest.raises(ValueError, match="preemption_mode"):
        v0("evict")
    with pytest.raises(ValueError, match="watermark"):
        make_scheduler("vllm-v0", policy_config=("watermark=1.5",))


def test_opt_shapes_match_their_published_sizes():
    for name, billions in (("opt-2.7b", 2.7), ("opt-6.7b", 6.7), ("opt-13b", 13)):
        params = MODEL_SHAPES[name].weight_bytes / 2 / 1e9
        assert abs(params - billions) / billions < 0.1, (name, params)
