"""EconoServe's KV pipelining across the pool (``lend_scope=pool``): the unwritten tails of
exact allocations carry other GTs without an allocation failure."""
from sched_helpers import add, make_request, make_scheduler, step


def run(*options):
    """Two long GTs (100 tokens: 26 blocks each when allocated whole) and four of 36 tokens,
    too long for a host's half (<= 50 - buffer) and too big for the 6 blocks the two exact
    allocations leave free. Returns the GTs decoding at each iteration, the iterations to
    drain, and the scheduler."""
    s = make_scheduler("econoserve", policy_config=("padding_ratio=0", *options),
                       num_gpu_blocks=64, block_size=4, max_model_len=128)
    reqs = [make_request(f"long{i}", 4, 100, predicted_output_len=100, slo_deadline_s=10)
            for i in range(2)]
    reqs += [make_request(f"short{i}", 4, 36, predicted_output_len=36, slo_deadline_s=10)
             for i in range(4)]
    add(s, *reqs)
    decoding, i = [], 0
    while s.has_unfinished_requests():
        out, _ = step(s, float(i))
        decoding.append(sum(1 for r, n in out.scheduled if n == 1 and r.num_output_tokens >= 2))
        assert s.block_manager.num_free_blocks >= 0
        i += 1
        assert i < 400
    assert [r.num_output_tokens for r in reqs] == [100, 100, 36, 36, 36, 36]
    return decoding, i, s


def test_the_pool_lends_every_unwritten_tail_where_one_hosts_halves_do_not_fit():
    decoding, iterations, s = run()                      # the default scope: the pool
    # All six decode together by the second decoding iteration (the last prompt is admitted
    # one iteration late, its prompt counted twice): the shorts end, buffer included, before
    # the long GTs' writes reach the blocks they used.
    assert decoding[2] == 6 and iterations <= 102
    assert s.stats().num_preemptions == 0 and s.policy.num_pauses == 0
    per_host, host_iterations, _ = run("lend_scope=host")
    assert max(per_host) < 6 and host_iterations > iterations + 20
    whole, whole_iterations, _ = run("enable_pipelining=false")
    assert max(whole[:30]) == 2 and whole_iterations > iterations + 20


def test_prefilled_gts_waiting_for_kv_hold_no_more_than_the_reserve_by_default():
    # One long GT's projection takes most of the pool; twelve prompts arrive behind it. Their
    # prefilled GTs wait idle, holding prompt KV the decoding GTs cannot use: by default no
    # more than the reserve's size (1 of 64 blocks here) plus the prompt that crossed it
    # (at the old 0.1: 7).
    s = make_scheduler("econoserve", policy_config=("padding_ratio=0",), num_gpu_blocks=64,
                       block_size=4, max_model_len=256)
    add(s, make_request("long", 4, 200, predicted_output_len=200, slo_deadline_s=100))
    step(s)
    step(s)
    # 3-token prompts: no full block, so none is shared through the prefix cache.
    shorts = add(s, *(make_request(f"p{i}", 3, 60, predicted_output_len=60,
                                   slo_deadline_s=100) for i in range(12)))
    waiting = []
    for i in range(600):
        if not s.has_unfinished_requests():
            break
        step(s, float(i))
        waiting.append(sum(s.block_manager.num_blocks_of(r.request_id)
                           for r in s.policy.gts.ordered() if r.num_output_tokens <= 1))
    assert all(r.num_output_tokens == 60 for r in shorts)
    assert s.policy.waiting_cap == 1 and max(waiting) <= s.policy.reserved_blocks + 1 == 3


def test_the_projection_from_its_block_steps_equals_the_sum_of_every_gts_use():
    """``projection`` builds the summed use from the iterations where a GT takes a block; it
    must give, at every iteration, the sum of ``blocks_for(min(n + t, target))`` over the GTs
    whose span has not ended (a prompt past its target, spans shorter than the remainder and
    block sizes of 1 included)."""
    import numpy as np

    from services.scheduler.policies.econo_pool import projection
    rng = np.random.default_rng(0)
    for trial in range(300):
        gts = int(rng.integers(1, 12))
        bs = int(rng.choice([1, 4, 16, 32]))
        n = rng.integers(1, 600, gts)
        target = n + rng.integers(-3, 700, gts)
        span = np.maximum(target - n, 1) + rng.integers(0, 120, gts)
        span = np.where(rng.random(gts) < 0.2, rng.integers(1, 5, gts), span)
        want = np.zeros(int(span.max()), dtype=np.int64)
        for ni, ti, si in zip(n, target, span):
            want[:si] += -(-np.minimum(ni + np.arange(si), ti) // bs)
        got = projection(n, target, span, bs)
        assert got.dtype == np.int64 and np.array_equal(got, want), trial
