"""The in-process executor: waves, validation without damage, model info, timings."""
from __future__ import annotations

import pytest
import torch

from lenserve_contract.sampling_params import InvalidRequestError, SamplingParams
from services.executor.runner import InProcessExecutor
from services.executor.types import ExecutorInput, ScheduledSequence

GREEDY = SamplingParams(temperature=0.0)


@pytest.fixture(scope="module")
def executor():
    return InProcessExecutor("llama-tiny", block_size=4, num_gpu_blocks=32, max_model_len=64)


def mixed_batch() -> list[ScheduledSequence]:
    """Two prefills (one a later chunk) and a decode, with disjoint blocks."""
    return [
        ScheduledSequence("a", list(range(3000, 3009)), 0, [0, 1, 2], True, GREEDY),
        ScheduledSequence("b", list(range(4000, 4006)), 0, [3, 4], False, GREEDY),
        ScheduledSequence("c", [5000], 0, [5], True, GREEDY),
        ScheduledSequence("d", list(range(6000, 6013)), 0, [6, 7, 8, 9], True, GREEDY),
    ]


def test_waves_give_identical_logits(executor):
    full, _, _, _ = executor.forward_logits(ExecutorInput(0, mixed_batch()))
    for waves in ([[0, 2], [1, 3]], [[3], [0], [2], [1]]):
        waved, ctx, _, _ = executor.forward_logits(ExecutorInput(0, mixed_batch(), waves=waves))
        assert torch.equal(full, waved)
        assert len(ctx.wave_attention_s) == len(waves) and min(ctx.wave_attention_s) > 0


def test_waves_must_cover_every_sequence_once(executor):
    with pytest.raises(ValueError, match="exactly once"):
        executor.forward_logits(ExecutorInput(0, mixed_batch(), waves=[[0, 1], [1, 2]]))


def test_only_sampling_sequences_get_tokens_and_timings(executor):
    out = executor.execute(ExecutorInput(7, mixed_batch()))
    assert out.iteration == 7 and set(out.sampled) == {"a", "c", "d"}
    assert all(lp <= 0.0 for lp in out.logprobs.values())
    t = out.timings
    assert 0.0 < t.attention_s <= t.forward_s <= t.total_s


@pytest.mark.parametrize("seq,field", [
    (ScheduledSequence("x", [1, 2], 0, [99], True, GREEDY), "block_table"),
    (ScheduledSequence("x", [1, 2], 63, [0] * 17, True, GREEDY), "max_model_len"),
    (ScheduledSequence("x", [1] * 9, 0, [0, 1], True, GREEDY), "block_table"),
    (ScheduledSequence("x", [40000], 0, [0], True, GREEDY), "token_ids"),
    (ScheduledSequence("x", [], 0, [0], True, GREEDY), "token_ids"),
])
def test_bad_sequences_are_refused_without_touching_the_pool(executor, seq, field):
    before = executor.kv.cache.clone()
    good = ScheduledSequence("ok", [1, 2, 3], 0, [10], True, GREEDY)
    with pytest.raises(InvalidRequestError) as err:
        executor.execute(ExecutorInput(0, [good, seq], copy_blocks=[(0, 1)]))
    assert err.value.field == field
    assert torch.equal(executor.kv.cache, before)


def test_overlapping_writes_and_duplicate_ids_are_refused(executor):
    a = ScheduledSequence("a", [1, 2], 0, [3], True, GREEDY)
    with pytest.raises(InvalidRequestError, match="same KV slot"):
        executor.execute(ExecutorInput(0, [a, ScheduledSequence("b", [1], 1, [3], True, GREEDY)]))
    with pytest.raises(InvalidRequestError, match="twice"):
        executor.execute(ExecutorInput(0, [a, a]))


def test_model_info_describes_model_and_pool(executor):
    info = executor.model_info()
    assert (info.family, info.num_heads, info.num_kv_heads, info.head_dim) == ("llama", 4, 2, 16)
    assert (info.block_size, info.num_gpu_blocks, info.max_model_len) == (4, 32, 64)
    # layers * (K, V) * block_size * kv_heads * head_dim * element ("auto": bf16 or fp32 here)
    element = torch.empty(0, dtype=getattr(torch, info.dtype)).element_size()
    assert info.bytes_per_block == 2 * 2 * 4 * 2 * 16 * element and info.eos_token_id == 102


def test_pool_size_follows_the_memory_budget():
    per_block = 2 * 2 * 16 * 64 * 4  # layers * (K, V) * block_size * hidden * float32
    ex = InProcessExecutor("opt-tiny", block_size=16, kv_cache_memory_bytes=10 * per_block + 1,
                           dtype="float32")
    assert ex.kv.num_blocks == 10
    with pytest.raises(InvalidRequestError, match="max_model_len"):
        InProcessExecutor(ex.loaded, max_model_len=10**6)
    with pytest.raises(InvalidRequestError, match="attention backend"):
        InProcessExecutor(ex.loaded, attention_backend="flash")


def test_auto_backend_takes_the_cpu_kernel_on_a_cpu(executor):
    ex = InProcessExecutor(executor.loaded, num_gpu_blocks=8)
    assert ex.backend.name == "cpu"
    assert ex.model_info().attention_backend == "cpu"


def test_auto_backend_falls_back_to_torch_without_the_kernel(executor, monkeypatch):
    from services.executor.attention import cpu_kernels

    monkeypatch.setattr(cpu_kernels, "available", lambda: False)
    ex = InProcessExecutor(executor.loaded, num_gpu_blocks=8)
    assert ex.backend.name == "torch"
