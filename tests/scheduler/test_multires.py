"""MultiRes (the EconoServe paper's multi-resource baseline): exact allocation, and the
queued request nearest to the free resources picked, not the queue's head."""
import pytest
from sched_helpers import add, make_request, make_scheduler, scheduled, step

from services.scheduler.config import SchedulerConfig
from services.scheduler.policies import make_policy


def drain(s, limit=2000):
    for i in range(limit):
        if not s.has_unfinished_requests():
            return i
        step(s, float(i))
    raise AssertionError("did not drain")


def test_exact_allocation_never_meets_an_allocation_failure_where_vllm_v0_does():
    def run(policy, *options):
        s = make_scheduler(policy, policy_config=options, num_gpu_blocks=24, max_model_len=96)
        reqs = add(s, *(make_request(f"r{i}", 8, 40, predicted_output_len=40)
                        for i in range(6)))
        drain(s)
        assert all(r.num_output_tokens == 40 for r in reqs)
        return s.stats().num_preemptions
    assert run("multires", "padding_ratio=0") == 0
    assert run("vllm-v0") > 0          # admitted by prompt blocks, they outgrow the pool


def test_the_request_nearest_to_the_free_resources_is_admitted_not_the_head():
    s = make_scheduler("multires", policy_config=("padding_ratio=0",), num_gpu_blocks=24,
                       max_model_len=96, enable_prefix_caching=False)   # blocks as counted
    add(s, make_request("running", 8, 56, predicted_output_len=56))
    step(s)                                                       # 16 of 24 blocks allocated
    add(s, make_request("big", 8, 40, predicted_output_len=40),   # 12 blocks: does not fit
        make_request("tiny", 4, 4, predicted_output_len=4),       # 2 blocks
        make_request("fits", 8, 20, predicted_output_len=20))     # 7 blocks: nearest to 8
    out, _ = step(s)
    # "fits" leaves 1 block free, too few for "tiny"; FCFS would have stopped at "big".
    assert scheduled(out) == {"running": 1, "fits": 8}
    assert [r.request_id for r in s.policy.waiting] == ["big", "tiny"]


def test_bad_options_are_refused():
    with pytest.raises(ValueError):
        make_policy("multires", SchedulerConfig(num_gpu_blocks=8), ["max_candidates=0"])
