"""The simulator replays multi-turn conversations closed-loop and reports prefix hits: a
turn arrives only after the previous reply and its think time, and with caching on the
earlier turns' prompts are served from cache (fewer prefill tokens, so lower TTFT)."""
import dataclasses

import pytest
from lenserve.bench.simulation import simulate
from lenserve.workloads.datasets import load_conversations
from lenserve.workloads.multiturn import MultiTurnConfig, multiturn_requests, timed
from services.executor.fake import CharTokenizer
from services.simulator.cost_model import LinearCostModel
from tests.simulator.sim_helpers import SHAPE, make_spec, make_target


def _workload():
    groups = multiturn_requests(load_conversations(), CharTokenizer(),
                                MultiTurnConfig(30, seed=1, max_prompt_len=1500,
                                                max_total_len=2000, think_time_s=1.0))
    return timed("mt", groups, rate=0.5, seed=1)


def _run(caching: bool):
    # Prefill costs per token, so serving a prompt from cache shortens its first iteration.
    target = make_target(LinearCostModel(0.002, (1e-4, 0.0, 0.0)), num_gpu_blocks=2048,
                         block_size=16)
    target = dataclasses.replace(target, shape=dataclasses.replace(SHAPE, max_model_len=2048))
    spec = make_spec("vllm", target, max_model_len=2048, enable_prefix_caching=caching)
    return simulate(spec, _workload(), 0.5, show_progress=False)


def test_follow_up_turns_arrive_after_their_reply_and_think_time():
    workload = _workload()
    run = _run(True)
    by_id = {r.request_id: r for r in run.records}
    follow = [r for r in workload.requests if r.after]
    assert follow and all(by_id[r.request_id].success for r in workload.requests)
    for r in follow:
        prev = by_id[r.after]
        assert by_id[r.request_id].arrival_time == pytest.approx(prev.finish_time + r.think_s)


def test_caching_serves_earlier_turns_and_lowers_ttft():
    on, off = _run(True), _run(False)
    assert on.stats["prefix_cache_hits"] > 0 and on.stats["prefix_cache_hit_rate"] > 0.2
    assert off.stats["prefix_cache_hits"] == 0
    ttft = lambda run: sum(r.ttft for r in run.records) / len(run.records)  # noqa: E731
    assert ttft(on) < ttft(off)


def _run_small_pool(host_blocks: int):
    """A device pool of ~4 conversations' prompts: cached turns are evicted before their
    next turn arrives; with a host tier they wait on the host, uploaded over the link."""
    from services.simulator.host_tier import HostLink
    block_bytes = SHAPE.kv_bytes_per_token() * 16
    target = make_target(LinearCostModel(0.002, (1e-4, 0.0, 0.0)), num_gpu_blocks=160,
                         block_size=16)
    target = dataclasses.replace(target, shape=dataclasses.replace(SHAPE, max_model_len=2048),
                                 link=HostLink(block_bytes / 1e-4, block_bytes / 1e-4, 0.0,
                                               "test"))
    spec = make_spec("vllm", target, max_model_len=2048,
                     swap_space_gib=1024 * block_bytes / 2**30,
                     prefix_cache_host_blocks=host_blocks)
    return simulate(spec, _workload(), 0.5, show_progress=False)


def test_the_simulated_host_tier_turns_evictions_into_hits():
    device, host = _run_small_pool(0), _run_small_pool(1024)
    assert device.stats["prefix_cache_host_hits"] == 0
    assert host.stats["prefix_cache_host_hits"] > 0
    assert host.stats["prefix_cache_hits"] > device.stats["prefix_cache_hits"]
    # Prefill tokens computed: the same prompts, fewer of them recomputed.
    def computed(run):
        return run.stats["prefix_cache_queries"] - run.stats["prefix_cache_hits"]
    assert computed(host) < computed(device)
