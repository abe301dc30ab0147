"""The simulated host KV tier: the real manager's bookkeeping, copies in virtual time that
overlap the iterations, and the same swapping policies run on it as on the real engine."""
import dataclasses
import json

import pytest
import torch

from lenserve.bench.simulation import _Replay, simulate
from services.kvmanager.config import GIB, KVManagerConfig
from services.kvmanager.host_pool import host_block_bytes
from services.kvmanager.host_store import BlockLayout
from services.kvmanager.interface import HostPoolFullError, RequestNotHeldError
from services.scheduler.policies import POLICIES
from services.simulator.executor import SimExecutor, VirtualClock
from services.simulator.host_tier import HostLink, SimKVManager
from services.simulator.profile_file import Profile, ProfilePoint, SwapPoint, parse_profile
from services.simulator.profiler import measure_swaps
from services.simulator.roofline import hardware, host_link
from services.simulator.target import from_roofline
from services.executor.fake import FakeExecutor
from tests.simulator.sim_helpers import SHAPE, constant_cost, make_spec, make_target, workload
from tests.swap_policies import RandomSwapPolicy

BLOCK_BYTES = SHAPE.kv_bytes_per_token() * 4        # the test target's blocks hold 4 tokens


def link(seconds_per_block: float, latency_s: float = 0.0) -> HostLink:
    bandwidth = BLOCK_BYTES / seconds_per_block
    return HostLink(bandwidth, bandwidth, latency_s, "test")


def manager(num_host_blocks: int = 16, seconds_per_block: float = 0.001, int8: bool = False,
            clock: VirtualClock | None = None) -> SimKVManager:
    clock = clock or VirtualClock()
    info = SimExecutor(SHAPE, constant_cost(0.01), clock, num_gpu_blocks=32,
                       block_size=4).model_info()
    space = num_host_blocks * BLOCK_BYTES / GIB
    return SimKVManager(KVManagerConfig(space, int8=int8), info, link(seconds_per_block), clock)


def test_a_swap_out_overlaps_the_iteration_and_stalls_only_past_it():
    for per_block, end in ((0.001, 0.010), (0.005, 0.020)):     # 4 blocks: 4 ms, 20 ms
        kv = manager(seconds_per_block=per_block)
        handle = kv.swap_out("a", [0, 1, 2, 3])
        assert not handle.done()
        kv.clock.advance(0.010)                 # the iteration it overlaps
        handle.wait()
        assert kv.clock.now == pytest.approx(end)
        assert handle.done() and kv.holds("a")


def test_a_swap_in_waits_for_its_swap_out_and_copies_queue_per_direction():
    kv = manager(seconds_per_block=0.001)
    kv.swap_out("a", [0, 1])                    # out lane: 0 -> 2 ms
    kv.swap_out("b", [2, 3, 4])                 # out lane: 2 -> 5 ms
    into_a = kv.swap_in("a", [5, 6])            # in lane, after a's swap-out: 2 -> 4 ms
    into_b = kv.swap_in("b", [7, 8, 9])         # in lane, after b's swap-out: 5 -> 8 ms
    into_a.wait()
    assert kv.clock.now == pytest.approx(0.004)
    assert kv.num_free_host_blocks() == 13      # a's host blocks are freed once it landed
    into_b.wait()
    assert kv.clock.now == pytest.approx(0.008)
    stats = kv.stats()
    assert stats.num_free_host_blocks == 16 and stats.num_swapped_requests == 0
    assert stats.bytes_swapped_out == stats.bytes_swapped_in == 5 * BLOCK_BYTES
    kv.check_integrity()


def test_a_full_pool_refuses_and_reserves_nothing():
    kv = manager(num_host_blocks=4)
    kv.swap_out("a", [0, 1, 2])
    with pytest.raises(HostPoolFullError, match="needs 2 host blocks, 1 free"):
        kv.swap_out("b", [3, 4])
    assert kv.num_free_host_blocks() == 1 and not kv.holds("b")
    kv.free("a")
    assert kv.num_free_host_blocks() == 4
    kv.check_integrity()


def test_bad_swaps_are_refused():
    kv = manager()
    with pytest.raises(RequestNotHeldError, match="never swapped out"):
        kv.swap_in("ghost", [0])
    kv.swap_out("a", [0, 1])
    with pytest.raises(ValueError, match="already swapped out"):
        kv.swap_out("a", [2, 3])
    with pytest.raises(ValueError, match="cannot swap in to 3"):
        kv.swap_in("a", [4, 5, 6])
    kv.swap_in("a", [4, 5])
    with pytest.raises(RequestNotHeldError, match="already in flight"):
        kv.swap_in("a", [4, 5])
    with pytest.raises(ValueError, match="bad device blocks"):
        kv.swap_out("b", [99])


def test_int8_holds_more_blocks_in_the_same_memory():
    fp, q = manager(num_host_blocks=16), manager(num_host_blocks=16, int8=True)
    assert fp.num_host_blocks == 16
    # The real INT8 block: a byte per element plus each channel's scale and offset.
    assert q.block_bytes == host_block_bytes(BlockLayout(2, 4, 4, 16, torch.float32), True)
    assert q.num_host_blocks == 16 * BLOCK_BYTES // q.block_bytes > fp.num_host_blocks


def test_the_roofline_link_is_an_estimate_per_hardware():
    a100, h100 = host_link(hardware("a100-80g")), host_link(hardware("h100"))
    assert "ESTIMATE" in a100.source
    assert a100.overlaps_compute and h100.overlaps_compute     # copy engines beside the SMs
    assert h100.out_bytes_per_s == pytest.approx(2 * a100.out_bytes_per_s)
    assert any("host link" in note for note in from_roofline("a100-80g", "llama-2-7b").notes)


def _host_target(seconds_per_block: float, num_gpu_blocks: int = 24):
    return dataclasses.replace(make_target(num_gpu_blocks=num_gpu_blocks),
                               link=link(seconds_per_block))


SWAP_WORKLOAD = [(5 + 7 * i % 20, 3 + 11 * i % 25, 0.01 * i) for i in range(30)]


def test_random_swaps_keep_every_request_and_the_accounting(monkeypatch):
    monkeypatch.setitem(POLICIES, RandomSwapPolicy.name, RandomSwapPolicy)
    spec = make_spec(RandomSwapPolicy.name, _host_target(0.001), max_model_len=64,
                     swap_space_gib=8 * BLOCK_BYTES / GIB)
    replay = _replay(spec, SWAP_WORKLOAD)
    kv = replay.engine.kv_manager.stats()
    assert len(replay.done) == 30 and all(r.error is None for r in replay.done)
    assert kv.bytes_swapped_in > 0 and kv.num_swapped_requests == 0
    assert kv.num_free_host_blocks == kv.num_host_blocks == 8


def _replay(spec, requests) -> _Replay:
    replay = _Replay(spec, workload(*requests))
    replay.engine.check_integrity = True        # device and host accounting after every step
    replay.run(_NoBar())
    return replay


@pytest.mark.parametrize("policy", ["alise", "fastserve", "fluidinfer"])
def test_swapping_policies_swap_on_the_host_tier_and_pay_for_the_copies(policy):
    replays = {}
    for per_block in (1e-6, 0.004):
        spec = make_spec(policy, _host_target(per_block), max_model_len=64,
                         predictor="oracle", swap_space_gib=64 * BLOCK_BYTES / GIB)
        replays[per_block] = _replay(spec, SWAP_WORKLOAD)
    fast, slow = replays[1e-6], replays[0.004]
    for replay in (fast, slow):
        assert len(replay.done) == 30 and all(r.error is None for r in replay.done)
        kv = replay.engine.kv_manager.stats()
        assert kv.bytes_swapped_in > 0 and kv.num_swapped_requests == 0
    # Copies take virtual time: over the slow link the same workload ends later.
    assert slow.clock.now > fast.clock.now


def test_without_swap_measurements_the_host_tier_is_refused():
    spec = make_spec("alise", make_target(), swap_space_gib=0.001)
    with pytest.raises(ValueError, match="no swap measurements"):
        simulate(spec, workload((4, 2, 0.0)), 1.0, show_progress=False)


def _profile(swap) -> Profile:
    points = (ProfilePoint(((1, 16, 0),), (0.01,)), ProfilePoint(((4, 1, 15),), (0.02,)))
    return Profile(SHAPE, "cpu", 4, 64, points, swap=swap)


def test_profile_swap_points_round_trip_and_fit_latency_and_bandwidth():
    # 50 us per copy, 1 GB/s out and 2 GB/s in.
    swap = tuple(SwapPoint(n, (50e-6 + n * BLOCK_BYTES / 1e9,) * 2,
                           (50e-6 + n * BLOCK_BYTES / 2e9,) * 2) for n in (1, 4, 16))
    profile = parse_profile(json.loads(json.dumps(_profile(swap).to_json())))
    assert profile.swap == swap
    fitted = profile.host_link()
    assert fitted.out_bytes_per_s == pytest.approx(1e9)
    assert fitted.in_bytes_per_s == pytest.approx(2e9)
    assert fitted.latency_s == pytest.approx(50e-6)
    # Measured on a CPU: its copies take the cores the iterations use, and the simulated
    # tier says so to the scheduler, as the real KV manager does there.
    assert not fitted.overlaps_compute
    gpu = dataclasses.replace(_profile(swap), device="cuda").host_link()
    assert gpu.overlaps_compute
    assert _profile(()).host_link() is None
    data = _profile(swap).to_json()
    data["swap"][0]["out_s"] = [-1.0]
    with pytest.raises(ValueError, match="bad swap point"):
        parse_profile(data)


def test_measure_swaps_times_the_real_kv_manager():
    executor = FakeExecutor(num_gpu_blocks=32, block_size=4, max_model_len=64)
    points = measure_swaps(executor, repeats=2, sizes=(1, 8, 64))
    assert [p.num_blocks for p in points] == [1, 8]         # 64 exceeds the pool
    assert all(len(p.out_s) == len(p.in_s) == 2 and min(p.out_s + p.in_s) > 0 for p in points)


class _NoBar:
    def update(self, n):
        pass


def test_vllm_v0_waits_for_its_swap_copies_as_v0_does():
    # vLLM V0 copies swapped blocks on the compute stream before the forward pass: each copy,
    # out and in, lengthens its iteration, where a policy whose swap-outs overlap pays only
    # for what outlasts the iteration. All requests arrive at once, so the schedule is the
    # same over both links and the difference in duration is the copies' time alone.
    requests = [(4, 6, 0.0)] * 3 + [(4, 2, 0.0)]
    runs = {}
    for per_block in (1e-6, 0.004):              # 4 ms a block: under the 10 ms iteration
        spec = make_spec("vllm-v0", _host_target(per_block, num_gpu_blocks=4), max_model_len=16,
                         policy_config=("preemption_mode=swap",),
                         swap_space_gib=8 * BLOCK_BYTES / GIB)
        replay = _replay(spec, requests)
        assert len(replay.done) == 4 and all(r.error is None for r in replay.done)
        runs[per_block] = (replay.clock.now, replay.engine.kv_manager.stats())
    (fast, _), (slow, kv) = runs[1e-6], runs[0.004]
    copied = (kv.bytes_swapped_out + kv.bytes_swapped_in) / BLOCK_BYTES
    assert kv.bytes_swapped_out > 0
    assert slow - fast == pytest.approx(copied * (0.004 - 1e-6))
