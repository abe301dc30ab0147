"""The prefix cache's host tier end to end on the engine (fake executor, real in-process KV
manager). The fake executor's next token is a hash of the context read back from the KV
blocks, so a block uploaded into the wrong place, or freed under a reader, changes tokens."""
import pytest
from engine_helpers import make_engine, run_to_completion
from test_prefix_caching import CountingExecutor, _real_policies, run

from lenserve_contract.errors import InvalidRequestError
from lenserve_contract.sampling_params import SamplingParams
from services.executor.fake import FakeExecutor
from services.scheduler.policies import POLICIES
from tests.swap_policies import RandomSwapPolicy

BLOCK_BYTES = 64                       # one fake KV block (4 tokens) in the host pool
HOST = {"swap_space_gib": 64 * BLOCK_BYTES / 2**30, "prefix_cache_host_blocks": 40}
PARAMS = SamplingParams(max_tokens=3, ignore_eos=True)


@pytest.mark.parametrize("policy", _real_policies())
@pytest.mark.parametrize("seed", [0, 1])
def test_every_policy_gives_the_same_tokens_off_device_and_host(policy, seed):
    # 24 device blocks for chat-like prompts sharing prefixes: cached blocks are evicted,
    # written back, and uploaded again; integrity (device, host index, pool) every step.
    off, _ = run(policy, seed, caching=False)
    device, _ = run(policy, seed, caching=True)
    host, engine = run(policy, seed, caching=True, **HOST)
    assert device == off and host == off and len(off) == 24
    stats = engine.stats()
    assert stats.prefix_cache_hits >= stats.prefix_cache_host_hits
    assert engine.scheduler.state.prefix_host.num_written > 0
    if (policy, seed) == ("vllm", 0):
        assert stats.prefix_cache_host_hits > 0     # this run does upload from the host


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_swaps_beside_host_cached_prefixes_keep_tokens(monkeypatch, seed):
    # Swapped requests and cached blocks share one small host pool: swaps evict cache entries.
    monkeypatch.setitem(POLICIES, RandomSwapPolicy.name, RandomSwapPolicy)
    off, _ = run("vllm", seed, caching=False)
    small = {"swap_space_gib": 32 * BLOCK_BYTES / 2**30, "prefix_cache_host_blocks": 32}
    on, engine = run(RandomSwapPolicy.name, seed, caching=True, **small)
    assert on == off
    assert engine.kv_manager.stats().bytes_swapped_in > 0
    assert engine.scheduler.state.prefix_host.num_evicted > 0


def _engine(host: bool, blocks: int = 16, **extra):
    executor = CountingExecutor(FakeExecutor(num_gpu_blocks=blocks, block_size=4,
                                             max_model_len=64))
    config = {**HOST, **extra} if host else {}
    return make_engine(executor=executor, num_gpu_blocks=blocks, max_model_len=64,
                       **config), executor


def _serve(engine, rid, prompt):
    engine.add_request(rid, prompt_token_ids=prompt, sampling_params=PARAMS)
    return run_to_completion(engine)[rid].outputs[0].token_ids


def _evicting_session(engine):
    """A 32-token conversation, then unrelated prompts that take every device block (its
    cached blocks are evicted), then its next turn."""
    first = list(range(40, 72))
    tokens = [_serve(engine, "t1", first)]
    for i in range(3):
        tokens.append(_serve(engine, f"other{i}", [100 + i] * 36))
    tokens.append(_serve(engine, "t2", first + list(range(72, 80))))
    return tokens


def test_the_host_tier_turns_an_evicted_prefix_into_a_hit():
    results = {}
    for host in (False, True):
        engine, executor = _engine(host)
        results[host] = (_evicting_session(engine), executor.fed, engine.stats())
    assert results[True][0] == results[False][0]
    dev, both = results[False][2], results[True][2]
    # Device only: the first turn's blocks were evicted, the next turn recomputes them all.
    assert dev.prefix_cache_hits == 0
    # With the host tier the blocks come back, uploaded: all 8 but those whose write-back
    # the first eviction abandoned (it never waits for a copy; at most the 2 it evicted).
    assert both.prefix_cache_host_hits >= 24 and both.prefix_cache_hits >= 24
    assert results[False][1] - results[True][1] == both.prefix_cache_hits


def test_a_full_host_tier_evicts_its_least_recently_used_blocks():
    engine, _ = _engine(True, prefix_cache_host_blocks=4)
    _evicting_session(engine)
    host = engine.scheduler.state.prefix_host
    assert len(host) <= 4 and host.num_evicted > 0
    assert host.num_written == (host.num_evicted + host.num_uploaded + host.num_abandoned
                                + len(host))
    engine.kv_manager.check_integrity()


def test_an_abort_while_its_upload_is_in_flight_leaves_no_reference():
    engine, _ = _engine(True)
    first = list(range(40, 72))
    reference = _evicting_session(engine)[-1]
    for i in range(3):             # evict the conversation's blocks again
        _serve(engine, f"more{i}", [110 + i] * 36)
    kv, state = engine.kv_manager, engine.scheduler.state
    uploaded_before = engine.stats().prefix_cache_host_hits
    swap_in = kv.swap_in

    def abort_mid_copy(owner, blocks):
        handle = swap_in(owner, blocks)
        engine.abort_request("t3")          # its uploads are copying now
        return handle

    kv.swap_in = abort_mid_copy
    engine.add_request("t3", prompt_token_ids=first + list(range(72, 80)), sampling_params=PARAMS)
    engine.step()                           # integrity is checked after the step
    kv.swap_in = swap_in
    uploaded = engine.stats().prefix_cache_host_hits - uploaded_before
    assert uploaded > 0
    assert "t3" not in state.requests and not state.pinned_at and not len(state.block_manager.pins)
    assert not engine.scheduler.block_manager.owners()
    # The uploaded blocks landed as free cached blocks: the next turn finds them on the device.
    hits = engine.stats().prefix_cache_hits
    assert _serve(engine, "t4", first + list(range(72, 80))) == reference
    assert engine.stats().prefix_cache_hits - hits >= uploaded


def test_a_request_id_in_the_reserved_namespace_is_refused():
    engine, _ = _engine(True)
    with pytest.raises(InvalidRequestError):
        engine.add_request("\x1fprefix/1", prompt_token_ids=[1, 2, 3], sampling_params=PARAMS)


def test_the_host_tier_needs_swap_space():
    with pytest.raises(ValueError, match="swap_space_gib"):
        make_engine(prefix_cache_host_blocks=8)
