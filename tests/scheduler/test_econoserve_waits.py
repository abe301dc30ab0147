"""EconoServe's bounded waits, offload-free preemption, recursive pipelining and time-synced
selection, each in a scenario built to show it."""
from sched_helpers import add, make_request, make_scheduler, scheduled, step

from services.scheduler.request import RequestStatus


def econo(*options, **overrides):
    return make_scheduler("econoserve", policy_config=options, **overrides)


def test_a_large_gt_at_the_head_is_not_starved_by_a_stream_of_small_ones():
    # The scenario, scaled down: a 128-block pool kept busy by 100-token requests
    # arriving at 0.13 per iteration; a 1,000-token request arrives at iteration 300. Before,
    # the largest smaller GT that fit always took the KV as it freed and the large one never
    # started; its reservation now bounds the wait by the running GTs' remainders (~116).
    s = econo(num_gpu_blocks=128, block_size=16, max_model_len=2048,
              max_num_batched_tokens=512)
    big = make_request("big", 16, 1000, predicted_output_len=1000, slo_deadline_s=1.0)
    arrived, started = 300, None
    for i in range(arrived + 600):
        if i == arrived:
            add(s, big)
        if i * 13 // 100 != (i + 1) * 13 // 100:      # 0.13 arrivals per iteration
            add(s, make_request(f"s{i}", 16, 100, predicted_output_len=100,
                                slo_deadline_s=1.0))
        step(s, i * 0.02)
        if started is None and big.num_output_tokens > 1:
            started = i
            break
    assert started is not None and started - arrived <= 200, started


def test_pipelining_is_recursive_a_guest_hosts_in_what_it_borrowed():
    s = econo("lend_scope=host", "padding_ratio=0", "buffer_ratio=0.1", num_gpu_blocks=64)
    host = make_request("host", 4, 64, predicted_output_len=64, slo_deadline_s=10)
    guest = make_request("guest", 4, 24, predicted_output_len=24, slo_deadline_s=10)
    inner = make_request("inner", 4, 8, predicted_output_len=8, slo_deadline_s=10)
    add(s, host, guest, inner)
    step(s)
    out, _ = step(s)
    assert scheduled(out) == {"host": 1, "guest": 1, "inner": 1}
    assert s.policy.lender_of == {"guest": "host", "inner": "guest"}
    assert s.block_manager.num_blocks_of("inner") == 3          # 1 own + 2 from the guest
    for i in range(200):
        if not s.has_unfinished_requests():
            break
        step(s, float(i))
    assert [r.num_output_tokens for r in (host, guest, inner)] == [64, 24, 8]
    assert s.stats().num_preemptions == 0


def test_a_guest_that_outgrows_its_range_moves_to_the_host_tier_and_finishes():
    s = econo("lend_scope=host", "padding_ratio=0", "reserved_kv_fraction=0.1", num_gpu_blocks=32,
              num_host_blocks=32)
    host = make_request("host", 4, 40, predicted_output_len=40, slo_deadline_s=10)
    # Predicted to end well before the host needs its blocks back; it runs 5x longer.
    guest = make_request("guest", 4, 40, predicted_output_len=8, slo_deadline_s=10)
    add(s, host, guest)
    step(s)
    step(s)
    assert s.policy.lender_of == {"guest": "host"}
    moved_at = None
    for i in range(200):
        if not s.has_unfinished_requests():
            break
        out, _ = step(s, float(i))
        if any(rid == "guest" for rid, _ in out.swapped_out):
            moved_at = (guest.num_computed_tokens, host.num_tokens)
            assert guest.status is RequestStatus.SWAPPED
    assert moved_at is not None and moved_at[0] > 12            # its KV went to the host tier
    assert s.policy.num_guest_moves == 1
    assert [host.num_output_tokens, guest.num_output_tokens] == [40, 40]
    assert guest.num_preemptions == 1 and host.num_preemptions == 0


def test_time_synced_selection_runs_once_per_group_not_every_iteration():
    def run(sync):
        s = econo(f"sync_groups={sync}", "padding_ratio=0", num_gpu_blocks=256)
        reqs = [make_request(f"r{i}", 4, 40, predicted_output_len=40, slo_deadline_s=10)
                for i in range(12)]
        add(s, *reqs)
        iterations = 0
        while s.has_unfinished_requests():
            step(s, float(iterations))
            iterations += 1
        assert all(r.num_output_tokens == 40 for r in reqs)
        return s.policy.num_selections, iterations
    synced, iterations = run("true")
    every, same = run("false")
    assert same == iterations and every == iterations and synced <= 5
