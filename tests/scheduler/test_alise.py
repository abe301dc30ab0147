"""ALISE's mechanisms on hand-built scenarios where they change the order."""
import numpy as np
import pytest
from sched_helpers import add, make_request, make_scheduler, scheduled, step

from services.executor.types import ExecutorOutput, IterationTimings
from services.scheduler.output import Budget
from services.scheduler.policies.time_model import ExecutionTimeModel
from services.scheduler.request import RequestStatus


def _alise(num_host_blocks=0, options=(), **overrides):
    return make_scheduler("alise", num_host_blocks=num_host_blocks,
                          policy_config=tuple(options), **overrides)


def _finish_order(s, requests, now=0.0, arrivals=None, max_steps=500):
    order, arrivals = [], dict(arrivals or {})
    for i in range(max_steps):
        add(s, *arrivals.pop(i, []))
        step(s, now + i)
        order += [r.request_id for r in requests if r.is_finished and r.request_id not in order]
        if len(order) == len(requests) and not arrivals:
            return order
    raise AssertionError(f"did not drain: {order}")


@pytest.mark.parametrize("demotion, first", [("true", "b"), ("false", "a")])
def test_an_under_predicted_request_is_demoted_behind_a_shorter_one(demotion, first):
    s = _alise(options=["aging_rate=0", "preempt_margin_s=0", f"demotion={demotion}"],
               max_num_seqs=1)
    a = make_request("a", 4, max_tokens=30, predicted_output_len=2)    # really 30 long
    b = make_request("b", 4, max_tokens=6, predicted_output_len=6)
    add(s, a, b)
    assert _finish_order(s, [a, b])[0] == first
    if demotion == "true":
        assert s.policy.num_demotions >= 3 and s.policy.jobs.get("a") is None


def test_aging_bounds_the_wait_of_a_long_request_behind_a_stream_of_short_ones():
    def worst_wait(rate):
        s = _alise(options=[f"aging_rate={rate}"], max_num_seqs=1)
        long = make_request("long", 4, max_tokens=50, predicted_output_len=50)
        add(s, long)
        # One short every two iterations, each two iterations long: the device is never idle.
        shorts = {i: [make_request(f"s{i}", 4, max_tokens=2, predicted_output_len=2)]
                  for i in range(1, 160, 2)}
        for i, (r,) in shorts.items():
            r.metrics.arrival_time = float(i)
        everyone = [long] + [r for rs in shorts.values() for r in rs]
        order = _finish_order(s, everyone, arrivals=shorts)
        return s.policy.worst_wait_s, order.index("long")

    aged_wait, aged_pos = worst_wait(0.1)
    starved_wait, starved_pos = worst_wait(0.0)
    assert starved_pos == 80 and starved_wait > 150     # served only when the stream ends
    # With aging the long request runs after ~(its time - a short's) / rate of waiting; the
    # shorts that queue meanwhile wait about its length, not the length of the stream.
    assert aged_pos < 30 and aged_wait < 70


def _three_residents_and_a_queued(num_host_blocks, options, d_predicted):
    s = _alise(num_host_blocks, options=["aging_rate=0", *options], max_num_seqs=3)
    a, b, c = (make_request(n, 8, max_tokens=60, predicted_output_len=p)
               for n, p in (("a", 4), ("b", 5), ("c", 40)))
    add(s, a, b, c)
    step(s)
    d = make_request("d", 4, max_tokens=60, predicted_output_len=d_predicted)
    add(s, d)
    return s, c, d


@pytest.mark.parametrize("d_predicted, swap_wait_s, status", [
    (30, 0.001, RequestStatus.SWAPPED),
    (30, 100.0, RequestStatus.RUNNING),     # its estimated wait is short: it stays
    (59, 0.001, RequestStatus.RUNNING),     # d ranks behind c: nobody needs c's seat
])
def test_a_paused_request_is_offloaded_only_when_its_room_is_needed_and_its_wait_is_long(
        d_predicted, swap_wait_s, status):
    s, c, d = _three_residents_and_a_queued(64, [f"swap_wait_s={swap_wait_s}"], d_predicted)
    s.state.budget = Budget(2, 3)          # two decodes per iteration: c pauses, d queues
    out, _ = step(s)
    assert scheduled(out) == {"a": 1, "b": 1}
    assert c.status is status and d.status is RequestStatus.WAITING
    assert c.num_computed_tokens > 0       # swapped or kept, its KV survives


@pytest.mark.parametrize("host_blocks, status", [(64, RequestStatus.SWAPPED),
                                                 (1, RequestStatus.PREEMPTED),
                                                 (0, RequestStatus.PREEMPTED)])
def test_an_evicted_request_is_swapped_unless_the_host_tier_is_full(host_blocks, status):
    s, c, _d = _three_residents_and_a_queued(host_blocks, [], d_predicted=2)
    out, _ = step(s)
    assert c.status is status and "d" in scheduled(out)
    while not c.is_finished:
        step(s)                            # and it still finishes


def test_a_resident_that_cannot_grow_swaps_out_one_victim_not_every_worse_one():
    # Three residents fill the 9-block pool (3 blocks each); the two best need a 4th block in
    # the same iteration. A swap-out frees its blocks only after its copy, so one victim (the
    # worst) makes room for both next iteration: evicting more would swap out requests that
    # did not need to go (with a GPU's copy times, a cascade of swaps every iteration).
    s = _alise(64, options=["aging_rate=0"], num_gpu_blocks=9, max_model_len=32)
    a, b, c = (make_request(n, 11, max_tokens=20, predicted_output_len=p)
               for n, p in (("a", 10), ("b", 15), ("c", 20)))
    add(s, a, b, c)
    step(s)
    step(s)
    assert all(r.status is RequestStatus.RUNNING for r in (a, b, c))
    out, _ = step(s)
    assert c.status is RequestStatus.SWAPPED
    assert b.status is RequestStatus.RUNNING and a.status is RequestStatus.RUNNING
    assert not scheduled(out)                 # both wait one iteration for c's blocks
    out, _ = step(s)
    assert scheduled(out) == {"a": 1, "b": 1}
    assert sorted(_finish_order(s, [a, b, c])) == ["a", "b", "c"]


def test_a_late_prediction_re_ranks_a_queued_request():
    s = _alise(options=["aging_rate=0", "preempt_margin_s=0", "default_from_median=false",
                        "default_output_len=50"], max_num_seqs=1)
    a = make_request("a", 4, max_tokens=20, predicted_output_len=20)
    b = make_request("b", 4, max_tokens=60)            # no prediction yet: assumed 50 long
    add(s, a, b)
    step(s)
    assert a.status is RequestStatus.RUNNING and b.status is RequestStatus.WAITING
    s.set_prediction("b", type(a.prediction)(3, 3))
    step(s)
    assert b.status is RequestStatus.RUNNING and a.status is RequestStatus.PREEMPTED


def test_the_preemption_margin_stops_near_equal_requests_trading_places():
    def preemptions(margin):
        s = _alise(options=["aging_rate=0.5", f"preempt_margin_s={margin}"], max_num_seqs=1)
        reqs = add(s, *(make_request(f"r{i}", 4, 30, predicted_output_len=30) for i in range(3)))
        _finish_order(s, reqs)
        return s.state.num_preemptions

    assert preemptions(0.0) > 10 * max(1, preemptions(5.0))


def test_the_time_model_recovers_known_coefficients():
    t0, alpha, beta, c = 2e-4, 3e-6, 8e-3, 1.5e-3
    model = ExecutionTimeModel(min_samples=8, refit_every=1, forget=1.0)
    rng = np.random.default_rng(0)
    for _ in range(64):
        prefill, decodes = int(rng.integers(0, 512)), int(rng.integers(0, 32))
        prompt_sum = int(rng.integers(1, 300)) * decodes
        model.observe(prefill, prompt_sum, decodes,
                      t0 * prefill + alpha * prompt_sum + beta * decodes + c)
    assert model.fitted
    assert model.coefficients == pytest.approx((t0, alpha, beta, c), rel=1e-3)
    # Each remaining decode step is a whole iteration: it pays the fixed cost c too.
    assert model.estimate(100, 50, 10) == pytest.approx(100 * t0 + 10 * (alpha * 50 + beta + c),
                                                        rel=1e-3)


def test_remaining_time_counts_steps_when_iterations_are_weight_bound():
    # A decode iteration that reads the weights: 14 ms whatever the batch, 50 us per request.
    model = ExecutionTimeModel(min_samples=8, refit_every=1, forget=1.0)
    rng = np.random.default_rng(1)
    for _ in range(64):
        decodes = int(rng.integers(1, 64))
        model.observe(0, 80 * decodes, decodes, 0.014 + 5e-5 * decodes)
    short, long = model.estimate(0, 80, 30), model.estimate(0, 80, 600)
    assert short == pytest.approx(30 * 0.01405, rel=0.02)
    # Seconds of wall time: a second of aging (rate 0.1) cannot flip 30 against 600 tokens.
    assert long - short > 10 * 0.1


def test_the_queues_head_follows_every_push_and_discard():
    from services.scheduler.policies.alise_queues import PriorityQueues

    queues = PriorityQueues(num_queues=4, base_s=1.0)
    a, b, c = (make_request(rid, 4) for rid in "abc")
    assert queues.head() is None
    queues.push(a, key=5.0, aged_s=5.0, work_s=5.0)
    assert queues.head() == (5.0, a)
    queues.push(b, key=0.5, aged_s=0.5, work_s=0.5)       # a better one, in another queue
    assert queues.head() == (0.5, b)
    queues.push(b, key=9.0, aged_s=9.0, work_s=9.0)       # re-ranked behind a
    assert queues.head() == (5.0, a)
    queues.push(c, key=2.0, aged_s=5.0, work_s=5.0)       # same queue as a, better key
    assert queues.head() == (2.0, c)
    assert queues.discard(c) and queues.head() == (5.0, a)
    assert not queues.discard(c) and queues.head() == (5.0, a)
    queues.discard(a)
    queues.discard(b)
    assert queues.head() is None and len(queues) == 0


def test_the_inlined_ranking_agrees_with_remaining_s():
    s = _alise(max_num_batched_tokens=16)
    policy = s.policy
    add(s, make_request("a", 10, 40), make_request("b", 3, 5), make_request("c", 21, 12),
        make_request("d", 2, 200, predicted_output_len=3))
    checked = 0
    for i in range(80):
        out = s.schedule(float(i))
        ranked = [r for rid, r in s.state.running.items() if rid in policy._remaining]
        for req in ranked:          # residents ranked before this iteration's admissions
            rid = req.request_id
            waited = policy._waited(policy.jobs[rid], float(i))
            assert policy._remaining[rid] == policy.remaining_s(req)
            assert policy._keys[rid] == policy.remaining_s(req) - 0.1 * waited
            checked += 1
        step_out = s.make_executor_input(out)
        sampled = {q.request_id: 7 for q in step_out.sequences if q.sample}
        timed = IterationTimings(total_s=0.01 + 0.001 * out.num_batched_tokens)
        s.update_from_output(out, ExecutorOutput(out.iteration, sampled, timings=timed),
                             float(i))
    assert checked > 60 and policy.model.fitted      # prior and fitted rates both seen
