"""ALISE combined with FluidInfer: ``alise-fluid`` (ALISE's order decides who starts,
FluidInfer's cycle runs who has started) and ``alise-lb`` (ALISE with FluidInfer's latency
bound: a started request's stream never waits past ``max_gap_s`` for rank)."""
import pytest
from sched_helpers import add, make_request, make_scheduler, scheduled, step

from services.scheduler.policies import make_policy
from services.scheduler.request import Prediction


def drain(s, limit=2000, start=0.0):
    """Iterations until every request is done, one second of the clock apart from ``start``."""
    outs = []
    for i in range(limit):
        if not s.has_unfinished_requests():
            return outs
        outs.append(step(s, start + i)[0])
    raise AssertionError("did not drain")


@pytest.mark.parametrize("policy, first", [("alise-fluid", "short"), ("fluidinfer", "long")])
def test_a_short_request_queued_behind_a_long_one_starts_first(policy, first):
    # A token budget of one prompt per iteration: whoever is admitted first is the order.
    s = make_scheduler(policy, max_num_batched_tokens=4)
    add(s, make_request("long", 4, 40, predicted_output_len=40),
        make_request("short", 4, 2, predicted_output_len=2))
    out, _ = step(s)
    assert list(scheduled(out)) == [first]


def test_a_late_prediction_reranks_a_queued_request():
    s = make_scheduler("alise-fluid", max_num_batched_tokens=4)
    add(s, make_request("a", 4, 40, predicted_output_len=40), make_request("b", 4, 40))
    # "b" has no prediction: ranked by the default length (128) behind "a", until its
    # prediction says it is short.
    s.set_prediction("b", Prediction(2, 4))
    out, _ = step(s)
    assert list(scheduled(out)) == ["b"]


def test_aging_lets_a_long_request_that_waited_start_before_a_new_short_one():
    s = make_scheduler("alise-fluid", max_num_batched_tokens=4,
                       policy_config=("aging_rate=1", "nominal_token_s=0.01"))
    old = make_request("old", 4, 40, predicted_output_len=40)     # 0.4 s of decodes
    new = make_request("new", 4, 2, predicted_output_len=2)
    new.metrics.arrival_time = 10.0                                 # arrived 10 s later
    add(s, old, new)
    out, _ = step(s, 10.0)
    assert list(scheduled(out)) == ["old"]


def stalls(policy, num_short=24, **options):
    """The longest run of iterations in which a started long request got no token while
    short requests with far shorter predictions kept arriving, one per iteration (a pool of 8
    blocks of 4: the long one alone ends up filling 7)."""
    s = make_scheduler(policy, num_gpu_blocks=8, num_host_blocks=64, max_model_len=32,
                       policy_config=tuple(f"{k}={v}" for k, v in options.items()))
    (long,) = add(s, make_request("long", 4, 24, predicted_output_len=24))
    outs = [step(s, 0.0)[0]]
    for i in range(num_short):
        add(s, make_request(f"s{i}", 4, 4, predicted_output_len=4))
        outs.append(step(s, float(i + 1))[0])
    outs += drain(s, start=num_short + 1.0)
    ran = [i for i, o in enumerate(outs) if "long" in scheduled(o)]
    assert long.num_output_tokens == 24 and ran
    return max(b - a for a, b in zip(ran, ran[1:])) - 1


def test_a_started_request_waits_only_for_fluidinfers_cycle_not_for_every_shorter_one():
    # Under alise the long request sits out while each short one runs (24 arrivals: a stall
    # of 24 iterations); under alise-fluid only FluidInfer's cycle pauses it (its quantum
    # over, it is offloaded for an upload and comes back), whatever the arrivals.
    cycle = stalls("fluidinfer")
    assert stalls("alise-fluid") == cycle
    assert stalls("alise", preempt_margin_s=0) >= 3 * cycle > 0


@pytest.mark.parametrize("quantum", [1, 8])
def test_alise_lb_bounds_the_stall_by_max_gap_not_by_the_arrivals(quantum):
    # One iteration per second of the test clock. The long request is rescued once it has
    # waited max_gap_s (3 iterations), one iteration later when its blocks come from a
    # victim's swap-out, later again when an older stalled request is rescued first.
    stall = stalls("alise-lb", preempt_margin_s=0, max_gap_s=3, gap_quantum=quantum)
    assert 3 <= stall <= 7 < stalls("alise", preempt_margin_s=0)


def test_alise_lb_guards_a_rescued_request_for_its_quantum():
    s = make_scheduler("alise-lb", num_gpu_blocks=8, num_host_blocks=64, max_model_len=32,
                       policy_config=("preempt_margin_s=0", "max_gap_s=3", "gap_quantum=4"))
    add(s, make_request("long", 4, 24, predicted_output_len=24))
    runs, now = [], 0.0
    for i in range(30):
        if i < 24:
            add(s, make_request(f"s{i}", 4, 4, predicted_output_len=4))
        out, _ = step(s, now)
        runs.append("long" in scheduled(out))
        now += 1
    assert s.policy.num_gap_rescues > 0
    # Every rescue is followed by at least gap_quantum iterations in a row.
    streaks = "".join("x" if r else "." for r in runs).split(".")
    assert all(len(x) >= 4 for x in streaks[1:] if x)


def test_started_requests_cycle_through_the_host_tier_and_all_finish():
    s = make_scheduler("alise-fluid", num_host_blocks=32, num_gpu_blocks=8, max_model_len=32,
                       policy_config=("max_swaps_per_step=2",))
    reqs = add(s, *(make_request(f"r{i}", 4, 12, predicted_output_len=12 - i) for i in range(6)))
    outs = drain(s)
    assert any(o.swapped_out for o in outs) and any(o.swapped_in for o in outs)
    assert all(r.num_output_tokens == 12 for r in reqs)
    assert s.stats().num_free_host_blocks == 32


def test_bad_options_are_refused():
    s = make_scheduler("alise-fluid")
    for bad in ("aging_rate=-1", "nominal_token_s=0", "default_output_len=0"):
        with pytest.raises(ValueError, match="alise-fluid"):
            make_policy("alise-fluid", s.config, [bad])
    for bad in ("max_gap_s=-1", "gap_quantum=0"):
        with pytest.raises(ValueError, match="alise-lb"):
            make_policy("alise-lb", s.config, [bad])


def test_alise_lb_keeps_its_stalled_list_bounded_as_requests_are_requeued():
    s = make_scheduler("alise-lb")
    (req,) = add(s, make_request("r", 4, 8))
    step(s)                                    # started: it has a token
    policy, job = s.policy, s.policy.jobs["r"]
    for i in range(500):                       # re-queued after each of 500 more waits
        job.since = float(i)
        policy._push(req)
    assert len(policy._stalled) <= 2 * len(policy.queues) + 64
    assert policy._stalled_head(1e9) is req    # the live entry survives compaction
