"""Streamed attention waves (FluidInfer §4.1, Fig. 7b-8) on the real CPU executor: one forward
pass runs requests whose KV is several times the device pool, the KV of most of them read
from the host tier layer by layer; tokens are identical to ``vllm`` with a pool that holds
everything, and block accounting on the device and the host holds after every step."""
import logging
import random

import pytest
from engine_helpers import TickClock

from lenserve.engine.llm_engine import EngineConfig, LLMEngine
from lenserve_contract.sampling_params import SamplingParams
from services.executor.runner import InProcessExecutor
from services.scheduler.request import RequestStatus

BLOCK = 4
HOST_GIB = 4 / 1024          # 4 MiB: llama-tiny's blocks of 4 tokens are small


@pytest.fixture(scope="module")
def loaded():
    return InProcessExecutor("llama-tiny", block_size=BLOCK, num_gpu_blocks=8).loaded


def make(loaded, policy, num_gpu_blocks, swap_gib=0.0, staged=None, staging_blocks=0,
         policy_config=(), tokens=256):
    ex = InProcessExecutor(loaded, block_size=BLOCK, num_gpu_blocks=num_gpu_blocks,
                           max_model_len=64)
    if staged is not None:      # force the staged (GPU) path on the CPU
        attach = ex.attach_stream_source
        ex.attach_stream_source = lambda host: attach(host, staged=staged,
                                                      staging_blocks=staging_blocks)
    cfg = EngineConfig(model="llama-tiny", policy=policy, check_integrity=True,
                       max_model_len=64, block_size=BLOCK, swap_space_gib=swap_gib,
                       max_num_batched_tokens=tokens, policy_config=tuple(policy_config))
    return LLMEngine(cfg, executor=ex, clock=TickClock())


def workload(seed, n):
    rng = random.Random(seed)
    return [(f"r{i}", [rng.randrange(3, 500) for _ in range(rng.randint(4, 20))],
             rng.randint(4, 24)) for i in range(n)]


def run(engine, reqs, arrive_every=0, record=None):
    core = engine
    if record is not None:
        schedule = core.scheduler.schedule

        def spy(now):
            out = schedule(now)
            record.append(out)
            return out
        core.scheduler.schedule = spy
    done, pending = {}, list(reqs)
    for step in range(5000):
        if pending and (arrive_every == 0 or step % arrive_every == 0):
            batch = pending if arrive_every == 0 else pending[:1]
            for rid, prompt, n in batch:
                engine.add_request(rid, prompt_token_ids=prompt, sampling_params=SamplingParams(
                    max_tokens=n, ignore_eos=True, temperature=0))
            pending = pending[len(batch):]
        if not pending and not engine.has_unfinished_requests():
            return {k: v.outputs[0].token_ids for k, v in done.items()}, core
        for out in engine.step():
            if out.finished:
                assert out.error is None, out.error
                done[out.request_id] = out
    raise AssertionError("did not drain")


def test_one_iteration_runs_three_times_the_device_pool(loaded):
    reqs = workload(0, 16)
    reference, _ = run(make(loaded, "vllm", 256), reqs)
    seen = []
    tokens, core = run(make(loaded, "fluidinfer", 16, HOST_GIB), reqs, record=seen)
    assert tokens == reference
    pool = 16
    blocks = [sum(-(-(r.num_computed_tokens + n) // BLOCK) for r, n in out.scheduled)
              for out in seen]
    assert max(blocks) >= 3 * pool, max(blocks)
    assert max(len(out.streamed) for out in seen) >= 8
    assert core.kv_manager.stats().num_swapped_requests == 0


@pytest.mark.parametrize("staged", [False, True])
@pytest.mark.parametrize("seed", [1, 2])
def test_random_workloads_with_streaming_keep_tokens_and_accounting(loaded, seed, staged):
    reqs = workload(seed, 14)
    reference, _ = run(make(loaded, "vllm", 256), reqs, arrive_every=2)
    seen = []
    engine = make(loaded, "fluidinfer", 20, HOST_GIB, staged=staged, staging_blocks=24,
                  policy_config=["stream_kv_blocks=24"])
    tokens, core = run(engine, reqs, arrive_every=2, record=seen)
    assert tokens == reference
    assert sum(len(o.streamed) for o in seen) > 0
    assert max(len([w for w in (o.waves or [])])for o in seen) >= 2


def test_alise_fluid_streams_too(loaded):
    reqs = workload(4, 12)
    reference, _ = run(make(loaded, "vllm", 256), reqs)
    seen = []
    tokens, _ = run(make(loaded, "alise-fluid", 16, HOST_GIB), reqs, record=seen)
    assert tokens == reference and any(o.streamed for o in seen)


# -- bad input: every case ends with vllm's tokens, nothing lost, the reason logged ----------

def test_a_host_tier_too_small_for_the_streamed_set_loses_nothing(loaded):
    reqs = workload(5, 12)
    reference, _ = run(make(loaded, "vllm", 256), reqs)
    tiny = 12 * make(loaded, "vllm", 16).executor.kv.block_bytes / 2**30   # 12 host blocks
    seen = []
    tokens, core = run(make(loaded, "fluidinfer", 16, tiny), reqs, record=seen)
    assert tokens == reference
    assert core.scheduler.state.num_host_blocks == 12 and any(o.streamed for o in seen)
    # The tier filled up: offloads were refused (the policy recomputed or waited instead).
    assert core.scheduler.state.swap_refusals > 0


def test_a_wave_larger_than_the_staging_area_falls_back_to_resident_schedules(loaded, caplog):
    reqs = workload(6, 10)
    reference, _ = run(make(loaded, "vllm", 256), reqs)
    engine = make(loaded, "fluidinfer", 16, HOST_GIB, staged=True, staging_blocks=2)
    with caplog.at_level(logging.WARNING):
        tokens, core = run(engine, reqs)
    assert tokens == reference
    assert not core.scheduler.state.can_stream
    assert "staging" in core.scheduler.state.stream_off_reason
    assert "falling back to resident-only" in caplog.text


def test_a_failed_stream_copy_falls_back_and_loses_nothing(loaded, caplog):
    reqs = workload(7, 10)
    reference, _ = run(make(loaded, "vllm", 256), reqs)
    engine = make(loaded, "fluidinfer", 16, HOST_GIB)
    real, calls = engine.kv_manager.stream_blocks, []

    def flaky(rid, n):
        calls.append(rid)
        if len(calls) == 5:
            raise OSError("copy engine fault")
        return real(rid, n)
    engine.kv_manager.stream_blocks = flaky
    with caplog.at_level(logging.WARNING):
        tokens, core = run(engine, reqs)
    assert tokens == reference and len(calls) >= 5
    assert "copy engine fault" in core.scheduler.state.stream_off_reason
    assert "copy engine fault" in caplog.text


def test_an_int8_host_tier_cannot_stream_and_says_why(loaded):
    engine = make(loaded, "fluidinfer", 16, HOST_GIB)
    assert engine.scheduler.state.can_stream
    cfg = EngineConfig(model="llama-tiny", policy="fluidinfer", max_model_len=64,
                       block_size=BLOCK, swap_space_gib=HOST_GIB, kv_int8=True)
    ex = InProcessExecutor(loaded, block_size=BLOCK, num_gpu_blocks=16, max_model_len=64)
    int8 = LLMEngine(cfg, executor=ex, clock=TickClock())
    assert not int8.scheduler.state.can_stream
    assert "INT8" in int8.scheduler.state.stream_off_reason
