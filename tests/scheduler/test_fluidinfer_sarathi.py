import pytest
from sched_helpers import add, make_request, make_scheduler, scheduled, step

from services.scheduler.config import SchedulerConfig
from services.scheduler.policies import make_policy
from services.scheduler.policies.waves import pack_waves


def drain(s, limit=1000):
    outs = []
    for i in range(limit):
        if not s.has_unfinished_requests():
            return outs
        outs.append(step(s, float(i))[0])
    raise AssertionError("did not drain")


def test_packing_fills_the_bubble_beside_a_long_prefill_with_decodes():
    # Report Fig. 9: two long prefills, a short one, three decodes.
    costs = [25, 25, 4, 5, 5, 5]
    waves = pack_waves(costs, [1] * 6, kv_limit=100)
    assert waves == [[1, 0, 5, 4, 3, 2]]
    # A KV bound of 3 blocks closes a wave after three items, longest work first.
    waves = pack_waves(costs, [1] * 6, kv_limit=3)
    assert waves == [[1, 0, 5], [4, 3, 2]]
    assert sorted(i for w in waves for i in w) == list(range(6))


def test_an_item_larger_than_the_bound_runs_alone():
    assert pack_waves([9, 1, 1], [5, 1, 1], kv_limit=2) == [[2, 1], [0]]


def test_fluidinfer_splits_attention_into_waves_when_device_kv_is_the_limit():
    s = make_scheduler("fluidinfer", policy_config=("wave_kv_blocks=4",), max_num_seqs=2)
    add(s, *(make_request(f"r{i}", 4 + 2 * i, 6) for i in range(5)))
    out, batch = step(s)
    assert len(out.scheduled) == 5                   # max_num_seqs does not bound the pass
    assert out.waves is not None and len(out.waves) > 1
    assert batch.waves == out.waves
    bm = s.block_manager
    for wave in out.waves:
        if len(wave) > 1:
            assert sum(bm.num_blocks_of(out.scheduled[i][0].request_id) for i in wave) <= 4
    assert sorted(i for w in out.waves for i in w) == list(range(5))


def test_fluidinfer_without_a_bound_runs_one_wave():
    s = make_scheduler("fluidinfer")
    add(s, *(make_request(f"r{i}", 4, 3) for i in range(3)))
    out, _ = step(s)
    assert out.waves is None


def test_fluidinfer_cycles_requests_through_the_host_tier():
    s = make_scheduler("fluidinfer", num_host_blocks=32, num_gpu_blocks=8, max_model_len=32,
                       policy_config=("max_swaps_per_step=2",))
    reqs = add(s, *(make_request(f"r{i}", 4, 12) for i in range(6)))
    outs = drain(s)
    assert any(o.swapped_out for o in outs) and any(o.swapped_in for o in outs)
    assert all(r.num_output_tokens == 12 for r in reqs)
    assert s.stats().num_free_host_blocks == 32


@pytest.mark.parametrize("ahead", [True, False])
def test_fluidinfer_runs_an_upload_in_the_next_iteration_and_never_offloads_it_unrun(ahead):
    s = make_scheduler("fluidinfer", num_host_blocks=32, num_gpu_blocks=8, max_model_len=32,
                       policy_config=("max_swaps_per_step=2", f"upload_ahead={str(ahead).lower()}"))
    reqs = add(s, *(make_request(f"r{i}", 4, 12) for i in range(6)))
    outs = drain(s)
    uploads = 0
    for i, out in enumerate(outs):
        batch = scheduled(out)
        for rid, _ in out.swapped_in:
            uploads += 1
            if not ahead:
                assert rid in batch            # waited for, then run in the same iteration
                continue
            assert rid not in batch            # copies beside this iteration
            # Runs before it can be offloaded again.
            later = outs[i + 1:]
            ran = next(j for j, o in enumerate(later) if rid in scheduled(o))
            assert all(rid not in {r for r, _ in o.swapped_out} for o in later[:ran + 1])
    assert uploads > 0 and all(r.num_output_tokens == 12 for r in reqs)


@pytest.mark.parametrize("overlap", [True, False])
def test_fluidinfer_uploads_ahead_only_where_copies_run_beside_the_compute(overlap):
    # "auto" (the default) follows the KV manager: a GPU's copy engine runs the upload beside
    # an iteration, so the upload joins the next one; on a CPU the copy takes the iteration's
    # cores, so the upload is waited for and runs at once.
    s = make_scheduler("fluidinfer", num_host_blocks=32, num_gpu_blocks=8, max_model_len=32,
                       copies_overlap=overlap, policy_config=("max_swaps_per_step=2",))
    reqs = add(s, *(make_request(f"r{i}", 4, 12) for i in range(6)))
    outs = drain(s)
    uploads = [(i, rid) for i, o in enumerate(outs) for rid, _ in o.swapped_in]
    assert uploads and all(r.num_output_tokens == 12 for r in reqs)
    assert all((rid in scheduled(outs[i])) is not overlap for i, rid in uploads)


def residents_and_upload(quantum: int):
    """16 blocks of 4. After a prefill, four residents hold 2 blocks with 6 tokens (their
    3rd block is needed after 3 more iterations) and one holds 2 blocks with 9 tokens (its
    3rd is needed at once): 6 blocks free. A swapped request of 7 computed tokens needs 2."""
    s = make_scheduler("fluidinfer", num_host_blocks=32, num_gpu_blocks=16, max_model_len=32,
                       policy_config=(f"min_resident_steps={quantum}",))
    add(s, *(make_request(f"r{i}", 5, 20) for i in range(4)), make_request("long", 8, 20))
    step(s)
    assert s.block_manager.num_free_blocks == 6
    upload = make_request("s", 7, 4)
    upload.num_computed_tokens = 7
    return s, upload


def test_an_upload_leaves_room_for_the_residents_growth_over_its_quantum_only():
    # Over a quantum of 3 only "long" grows: 2 + 1 <= 6, the upload fits. A block kept for
    # every resident (2 + 5) would refuse it, as does a quantum of 4 (every resident grows).
    s, upload = residents_and_upload(3)
    assert s.policy._fits_with_headroom(s.state, upload)
    s, upload = residents_and_upload(4)
    assert not s.policy._fits_with_headroom(s.state, upload)


def cycle_with_quantum(quantum: int):
    """Drain a host-tier workload; returns the outputs and, for every request the policy
    offloaded to make room for an upload, how many iterations it had run since it entered
    the device (evictions for a request's own growth are not counted)."""
    s = make_scheduler("fluidinfer", num_host_blocks=64, num_gpu_blocks=12, max_model_len=48,
                       policy_config=("max_swaps_per_step=2", f"min_resident_steps={quantum}"))
    reqs = add(s, *(make_request(f"r{i}", 4, 32) for i in range(8)))
    policy, offloaded = s.policy, []
    original = policy._offload

    def offload(state, output):
        runs, before = dict(policy.steps_run), len(output.swapped_out)
        original(state, output)
        offloaded.extend(runs.get(rid, 0) for rid, _ in output.swapped_out[before:])

    policy._offload = offload
    outs = drain(s)
    assert all(r.num_output_tokens == 32 for r in reqs)
    return outs, offloaded


def test_fluidinfer_keeps_a_resident_for_its_quantum_and_so_runs_fuller_batches():
    fast, fast_offloaded = cycle_with_quantum(1)
    slow, slow_offloaded = cycle_with_quantum(6)
    assert fast_offloaded and slow_offloaded
    assert min(slow_offloaded) >= 6 and min(fast_offloaded) < 6
    # Fewer requests in transit: more tokens per iteration, fewer iterations to drain.
    assert len(slow) < len(fast)
    swaps = [sum(len(o.swapped_out) for o in outs) for outs in (fast, slow)]
    assert swaps[1] < swaps[0]


def test_sarathi_never_stalls_decodes_for_a_long_prompt():
    s = make_scheduler("sarathi", max_num_batched_tokens=8)
    add(s, make_request("a", 4, 20), make_request("b", 4, 20))
    step(s)
    add(s, make_request("long", 40, 4))
    for _ in range(6):
        out, _ = step(s)
        got = scheduled(out)
        assert got["a"] == 1 and got["b"] == 1 and got.get("long") == 6


def test_sarathi_evicts_a_prefilling_request_before_a_decode():
    s = make_scheduler("sarathi", num_gpu_blocks=6, max_model_len=24, max_num_batched_tokens=4)
    a = make_request("a", 4, 16)
    add(s, a)
    step(s)
    add(s, make_request("p", 16, 2))
    outs = drain(s)
    preempted = [r.request_id for o in outs for r in o.preempted]
    assert preempted and "a" not in preempted
    assert all(scheduled(o).get("a") == 1 for o in outs if not a.is_finished and "a" in scheduled(o))


@pytest.mark.parametrize("policy,option", [("fluidinfer", "no_such_key=1"),
                                           ("fluidinfer", "min_resident_steps=0"),
                                           ("fluidinfer", "wave_kv_blocks=1000"),
                                           ("fluidinfer", "wave_kv_blocks=-1"),
                                           ("fluidinfer", "upload_ahead=sometimes"),
                                           ("sarathi", "no_such_key=1"),
                                           ("sarathi", "token_budget=-1")])
def test_bad_options_are_refused(policy, option):
    with pytest.raises(ValueError):
        make_policy(policy, SchedulerConfig(num_gpu_blocks=64), [option])


@pytest.mark.parametrize("overlap", [True, False])
def test_fluidinfer_halves_the_wave_bound_only_where_copies_run_beside_the_compute(overlap):
    # With a host tier whose copies overlap the compute, one half of the pool computes while
    # the other is refilled, so attention runs in half-pool waves; where they cannot overlap
    # (a CPU executor), the residents attend over the whole pool in one wave.
    s = make_scheduler("fluidinfer", num_host_blocks=32, num_gpu_blocks=8, max_model_len=32,
                       copies_overlap=overlap)
    add(s, *(make_request(f"r{i}", 6, 4) for i in range(3)))    # 2 blocks each: 6 of 8
    out, batch = step(s)
    assert len(out.scheduled) == 3
    if overlap:
        assert out.waves is not None and len(out.waves) > 1 and batch.waves == out.waves
    else:
        assert out.waves is None
