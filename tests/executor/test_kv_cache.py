"""The paged KV pool: slot mapping, block copy, export/import, allocator invariants."""
from __future__ import annotations

import pytest
import torch

from lenserve_contract.sampling_params import InvalidRequestError, SamplingParams
from services.executor.kv_cache import BlockAllocator, KVCachePool, slot_mapping
from services.executor.runner import InProcessExecutor
from services.executor.types import ExecutorInput, ScheduledSequence

GREEDY = SamplingParams(temperature=0.0)


def make_pool(num_blocks: int = 6) -> KVCachePool:
    pool = KVCachePool(num_layers=2, num_blocks=num_blocks, block_size=4, num_kv_heads=2,
                       head_dim=3)
    pool.cache.copy_(torch.randn(pool.cache.shape))
    return pool


def test_slot_mapping_follows_the_block_table():
    assert slot_mapping([5, 2], start=2, num_tokens=4, block_size=4) == [22, 23, 8, 9]


def test_write_lands_in_the_mapped_slots():
    pool = make_pool()
    k, v = torch.randn(2, 2, 3), torch.randn(2, 2, 3)
    pool.write(1, k, v, torch.tensor([9, 14]))
    k_cache, v_cache = pool.layer(1)
    assert torch.equal(k_cache[2, 1], k[0]) and torch.equal(v_cache[3, 2], v[1])


def test_copy_blocks_reads_all_sources_before_writing():
    pool = make_pool()
    before = pool.cache.clone()
    pool.copy_blocks([(0, 1), (1, 2)])
    assert torch.equal(pool.cache[:, :, 1], before[:, :, 0])
    assert torch.equal(pool.cache[:, :, 2], before[:, :, 1])
    assert torch.equal(pool.cache[:, :, 3:], before[:, :, 3:])


def test_export_import_round_trip_with_host_layout():
    pool = make_pool()
    data = pool.export_blocks([4, 1])
    assert data.device.type == "cpu" and data.shape == (2, 2, 2, 4, 2, 3)
    other = make_pool()
    other.import_blocks([0, 5], data)
    assert torch.equal(other.cache[:, :, 0], pool.cache[:, :, 4])
    assert torch.equal(other.cache[:, :, 5], pool.cache[:, :, 1])


def test_export_writes_into_a_given_buffer_even_a_strided_view():
    pool = make_pool()
    host = torch.full((2, 2, 5, 4, 2, 3), -1.0)
    view = host[:, :, 1:3]                      # strided: not contiguous
    assert pool.export_blocks([4, 1], out=view) is view
    assert torch.equal(view, pool.export_blocks([4, 1]))
    assert (host[:, :, [0, 3, 4]] == -1).all()
    with pytest.raises(InvalidRequestError, match="export buffer"):
        pool.export_blocks([4, 1], out=torch.empty(2, 2, 3, 4, 2, 3))
    with pytest.raises(InvalidRequestError, match="export buffer"):
        pool.export_blocks([4], out=torch.empty(2, 2, 1, 4, 2, 3, dtype=torch.float64))


def test_bad_block_ids_and_shapes_are_refused_without_damage():
    pool = make_pool()
    before = pool.cache.clone()
    with pytest.raises(InvalidRequestError, match="6"):
        pool.copy_blocks([(0, 6)])
    with pytest.raises(InvalidRequestError, match="shape"):
        pool.import_blocks([0], torch.zeros(1))
    with pytest.raises(InvalidRequestError, match="-1"):
        pool.export_blocks([-1])
    assert torch.equal(pool.cache, before)


def test_allocator_keeps_its_invariants():
    alloc = BlockAllocator(5)
    a, b = alloc.allocate(2), alloc.allocate(3)
    assert sorted(a + b) == list(range(5)) and alloc.num_free == 0
    with pytest.raises(MemoryError):
        alloc.allocate(1)
    alloc.free(a)
    with pytest.raises(ValueError):
        alloc.free(a)
    alloc.check_integrity()
    assert alloc.num_free == 2


def test_exported_blocks_resume_decoding_elsewhere():
    """Swap a request out after prefill, into other blocks of a fresh executor: the next token
    is the same as if it had stayed."""
    prompt = list(range(2000, 2021))
    first = InProcessExecutor("opt-tiny", block_size=8, num_gpu_blocks=8)
    out = first.execute(ExecutorInput(0, [ScheduledSequence("r", prompt, 0, [0, 1, 2], True,
                                                            GREEDY)]))
    token = out.sampled["r"]
    step = ScheduledSequence("r", [token], len(prompt), [0, 1, 2], True, GREEDY, 1)
    stayed = first.execute(ExecutorInput(1, [step])).sampled["r"]

    second = InProcessExecutor(first.loaded, block_size=8, num_gpu_blocks=8)
    second.import_blocks([5, 3, 7], first.export_blocks([0, 1, 2]))
    step = ScheduledSequence("r", [token], len(prompt), [5, 3, 7], True, GREEDY, 1)
    assert second.execute(ExecutorInput(0, [step])).sampled["r"] == stayed
