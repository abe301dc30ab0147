import pytest
from sched_helpers import add, make_request, make_scheduler, scheduled, step

from services.scheduler.config import SchedulerConfig
from services.scheduler.policies import make_policy
from services.scheduler.request import Prediction


def econo(*options, **overrides):
    return make_scheduler("econoserve", policy_config=options, **overrides)


def drain(s, limit=500):
    finished_at = {}
    for i in range(limit):
        if not s.has_unfinished_requests():
            return finished_at
        out, _ = step(s, float(i))
        for r, _ in out.scheduled:
            if r.is_finished:
                finished_at[r.request_id] = i
    raise AssertionError("did not drain")


def test_a_time_synced_group_starts_and_finishes_together():
    s = econo("padding_ratio=0", "enable_pipelining=false")
    reqs = [make_request("a", 4, 6, predicted_output_len=6, slo_deadline_s=10),
            make_request("long", 4, 30, predicted_output_len=30, slo_deadline_s=10),
            make_request("b", 4, 6, predicted_output_len=6, slo_deadline_s=10)]
    add(s, *reqs)
    step(s)                                    # three prompts; all become queued GTs
    out, _ = step(s)
    assert scheduled(out) == {"a": 1, "long": 1, "b": 1}
    done = drain(s)
    assert done["a"] == done["b"] < done["long"]


def test_exact_allocation_sizes_kv_by_padded_prediction_or_upper_quantile():
    s = econo("padding_ratio=0.5", "enable_pipelining=false")
    add(s, make_request("a", 4, 100, predicted_output_len=8))
    step(s)
    step(s)
    assert s.block_manager.num_blocks_of("a") == 4          # 4 prompt + 12 output tokens
    q = econo("use_upper_quantile=true", "enable_pipelining=false")
    add(q, make_request("b", 4, 100))
    q.set_prediction("b", Prediction(8, 20))
    step(q)
    step(q)
    assert q.block_manager.num_blocks_of("b") == 6          # 4 + 20 tokens


@pytest.mark.parametrize("source, upper, blocks", [
    ("oracle", 8, 3),        # a predictor sure of its 8 tokens: 4 + 8, no padding
    ("retrieval", 10, 4),    # its calibrated quantile asks for 2 more: 4 + 10 tokens
    ("retrieval", 40, 4),    # a wide quantile is capped at the 50% padding: 4 + 12
    ("given", 8, 4),         # a client's own figure carries no calibration: padded in full
])
def test_padding_goes_no_further_than_the_calibrated_upper_quantile(source, upper, blocks):
    s = econo("padding_ratio=0.5", "enable_pipelining=false")
    add(s, make_request("a", 4, 100))
    s.set_prediction("a", Prediction(8, upper, source))
    step(s)
    step(s)
    assert s.block_manager.num_blocks_of("a") == blocks
    full = econo("padding_ratio=0.5", "enable_pipelining=false", "calibrated_padding=false")
    add(full, make_request("b", 4, 100))
    full.set_prediction("b", Prediction(8, upper, source))
    step(full)
    step(full)
    assert full.block_manager.num_blocks_of("b") == 4      # the paper's ratio, whatever


def test_with_a_sure_predictor_the_kv_padding_would_hold_runs_another_gt():
    """A 17-block pool (block 4, 1 reserved): two GTs predicted at 28 tokens (4 + 28: 8
    blocks each) fit it; padded by 15% (4 + 33 tokens, 10 blocks each) the second waits for
    the first. With a predictor that reports its 28 as sure (its upper quantile), econoserve
    runs both at once."""
    def started(*options):
        s = econo("enable_pipelining=false", "reserved_kv_fraction=0.05", *options,
                  num_gpu_blocks=17, max_model_len=64)
        for rid in ("a", "b"):
            add(s, make_request(rid, 4, 60))
            s.set_prediction(rid, Prediction(28, 28, "oracle"))
        step(s)
        out, _ = step(s)
        return scheduled(out)
    assert started() == {"a": 1, "b": 1}
    assert len(started("calibrated_padding=false")) == 1


def test_a_hosted_gt_borrows_the_second_half_and_returns_it():
    s = econo("lend_scope=host", "padding_ratio=0")
    host = make_request("host", 4, 40, predicted_output_len=40, slo_deadline_s=10)
    guest = make_request("guest", 4, 8, predicted_output_len=8, slo_deadline_s=10)
    add(s, host, guest)
    step(s)
    out, _ = step(s)
    assert scheduled(out) == {"host": 1, "guest": 1}
    assert s.policy.lender_of == {"guest": "host"}
    bm = s.block_manager
    assert bm.num_blocks_of("host") == 9 and bm.num_blocks_of("guest") == 3   # 2 lent
    while not guest.is_finished:
        step(s)
    assert bm.num_blocks_of("host") == 11 and not s.policy.lender_of   # loan came back
    drain(s)
    assert host.num_output_tokens == 40


def test_the_host_takes_a_guest_that_ends_in_time_not_the_largest_that_fits():
    s = econo("lend_scope=host", "padding_ratio=0")
    host = make_request("host", 4, 40, predicted_output_len=40, slo_deadline_s=10)
    # Fits the 4 spare blocks but would still run when the host needs them back.
    medium = make_request("medium", 4, 16, predicted_output_len=16, slo_deadline_s=10)
    small = make_request("small", 4, 8, predicted_output_len=8, slo_deadline_s=10)
    add(s, host, medium, small)
    step(s)
    out, _ = step(s)
    assert scheduled(out) == {"host": 1, "medium": 1, "small": 1}
    assert s.policy.lender_of == {"small": "host"}
    drain(s)
    assert [r.num_output_tokens for r in (host, medium, small)] == [40, 16, 8]


def test_a_host_whose_guest_finished_lends_again():
    s = econo("lend_scope=host", "padding_ratio=0", "reserved_kv_fraction=0.15",
              num_gpu_blocks=20, max_model_len=80)
    host = make_request("host", 4, 56, predicted_output_len=56, slo_deadline_s=10)
    first = make_request("first", 4, 8, predicted_output_len=8, slo_deadline_s=10)
    add(s, host, first)
    step(s)
    step(s)
    assert s.policy.lender_of == {"first": "host"}
    # Too big for the free KV once prefilled: it runs only in the host's unused half.
    second = make_request("second", 8, 10, predicted_output_len=10, slo_deadline_s=10)
    add(s, second)
    lenders = []
    for i in range(60):
        step(s, float(i))
        lenders.append(dict(s.policy.lender_of))
        if second.is_finished:
            break
    assert {"second": "host"} in lenders
    assert second.is_finished and not host.is_finished
    drain(s)
    assert host.num_output_tokens == 56


def waiting_and_prefilling_kv(*options):
    s = econo("padding_ratio=0", "enable_pipelining=false", "reserved_kv_fraction=0.1",
              *options, num_gpu_blocks=32)
    add(s, make_request("long", 4, 80, predicted_output_len=80, slo_deadline_s=100))
    step(s)
    step(s)
    short = add(s, *(make_request(f"p{i}", 4, 20, predicted_output_len=20, slo_deadline_s=100)
                     for i in range(12)))
    bm, policy, prefilling, waiting = s.block_manager, s.policy, [], []
    for i in range(300):
        if not s.has_unfinished_requests():
            break
        step(s, float(i))
        prefilling.append(sum(bm.num_blocks_of(rid) for rid in policy.prefilling))
        waiting.append(sum(bm.num_blocks_of(r.request_id) for r in policy.gts.ordered()))
    assert all(r.num_output_tokens == 20 for r in short)
    return policy, max(prefilling), max(waiting)


def test_prompts_prefill_in_the_reserve_whatever_the_waiting_gts_hold():
    policy, prefilling, waiting = waiting_and_prefilling_kv("waiting_kv_fraction=1")
    # Prompts kept coming while prefilled GTs held more than the reserve (before, they
    # waited beside free blocks once waiting GTs held 4), and never held more than it.
    assert prefilling <= policy.reserved_blocks == 4 < waiting


def test_prompt_kv_waiting_for_gt_allocations_is_capped():
    policy, _, waiting = waiting_and_prefilling_kv("waiting_kv_fraction=0.2")
    assert policy.waiting_cap == 6 and waiting <= 6 + 1       # the cap, plus one prompt


def test_under_prediction_pauses_the_gt_with_its_kv_instead_of_recomputing():
    s = econo("padding_ratio=0", "reserved_kv_fraction=0", "enable_pipelining=false",
              num_gpu_blocks=8, max_model_len=32, num_host_blocks=16)
    reqs = [make_request(r, 4, 12, predicted_output_len=1) for r in "abc"]
    add(s, *reqs)
    paused_with_kv = []
    for i in range(200):
        if not s.has_unfinished_requests():
            break
        step(s, float(i))
        gts = s.policy.gts.ordered()
        paused_with_kv += [r.num_computed_tokens for r in gts if r.num_output_tokens > 1
                           and s.block_manager.num_blocks_of(r.request_id)]
        # A paused GT ranks by the KV it holds: ahead of one holding less.
        held = [s.block_manager.num_blocks_of(r.request_id) for r in gts]
        assert held == sorted(held, reverse=True)
    assert s.policy.num_pauses > 0 and max(paused_with_kv) > 5     # outputs' KV kept
    assert all(r.num_output_tokens == 12 for r in reqs)
    assert s.stats().num_free_host_blocks == 16                 # never swapped


def test_slo_orders_prompts_before_arrival():
    s = econo(max_num_batched_tokens=8)
    add(s, make_request("relaxed", 8, slo_deadline_s=100.0),
        make_request("urgent", 8, slo_deadline_s=0.1))
    out, _ = step(s)
    assert list(scheduled(out)) == ["urgent"]


def test_a_prediction_arriving_late_reranks_a_queued_prompt():
    s = econo(max_num_batched_tokens=8)
    add(s, make_request("first", 4), make_request("second", 4))
    assert s.policy.pts.head().request_id == "first"
    s.set_prediction("first", Prediction(1000, 1000))      # a much later SLO deadline
    assert s.policy.pts.head().request_id == "second"


@pytest.mark.parametrize("option", ["reserved_kv_fraction=1", "reserved_kv_fraction=1.5",
                                    "buffer_ratio=0.5", "padding_ratio=-1", "no_such_key=1"])
def test_bad_options_are_refused_at_construction(option):
    with pytest.raises(ValueError):
        make_policy("econoserve", SchedulerConfig(num_gpu_blocks=64), [option])


def test_a_config_that_leaves_no_generation_kv_is_refused():
    with pytest.raises(ValueError, match="leaves none"):
        make_policy("econoserve", SchedulerConfig(num_gpu_blocks=4, max_model_len=16),
                    ["reserved_kv_fraction=0.9"])
