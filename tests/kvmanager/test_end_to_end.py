"""Greedy decoding through a swap with the real executor: out to the host pool, the device
blocks overwritten, back into *different* device blocks, decoding on."""
from __future__ import annotations

import pytest
import torch

from lenserve_contract.sampling_params import SamplingParams
from services.executor.kv_cache import BlockAllocator
from services.executor.runner import InProcessExecutor
from services.executor.types import ExecutorInput, ScheduledSequence
from services.kvmanager.config import KVManagerConfig
from services.kvmanager.core import InProcessKVManager
from tests.kvmanager.remote import KVManagerStack

GREEDY = SamplingParams(temperature=0.0)
PROMPTS = ["The quick brown fox jumps over the lazy dog near the river bank",
           "Serving large language models needs memory for the key value cache",
           "A short prompt"]
NEW_TOKENS, SWAP_AFTER, BLOCK = 12, 4, 4


@pytest.fixture(scope="module")
def executor():
    return InProcessExecutor("opt-tiny", block_size=BLOCK, num_gpu_blocks=64, max_model_len=64)


def encode(executor, text: str) -> list[int]:
    return executor.tokenizer(text)["input_ids"]


def generate(executor, prompt: list[int], manager=None) -> list[int]:
    """Greedy tokens; with a manager, the request is swapped out and back in after
    ``SWAP_AFTER`` tokens, its old device blocks scribbled over and handed to nobody. Every
    block starts with loud garbage, as blocks freed by other requests do: the slots after
    the last token must not matter."""
    executor.kv.cache.normal_(0, 100)
    alloc = BlockAllocator(executor.kv.num_blocks)
    alloc.allocate(7)                   # so the request does not start at block 0
    table = alloc.allocate(-(-len(prompt) // BLOCK))
    seq = ScheduledSequence("r", prompt, 0, table, True, GREEDY)
    tokens = [executor.execute(ExecutorInput(0, [seq])).sampled["r"]]
    while len(tokens) < NEW_TOKENS:
        context = len(prompt) + len(tokens) - 1
        if manager is not None and len(tokens) == SWAP_AFTER:
            table = swap_round_trip(executor, manager, alloc, table, context)
        if len(table) * BLOCK <= context:
            table = table + alloc.allocate(1)
        seq = ScheduledSequence("r", [tokens[-1]], context, table, True, GREEDY, len(tokens))
        tokens.append(executor.execute(ExecutorInput(len(tokens), [seq])).sampled["r"])
    return tokens


def swap_round_trip(executor, manager, alloc, table: list[int], num_tokens: int) -> list[int]:
    manager.swap_out("r", table, num_tokens).wait()
    new_table = alloc.allocate(len(table))      # the old blocks are still taken: all different
    cache = executor.kv.cache
    cache[:, :, table] = torch.randn(cache[:, :, table].shape, dtype=cache.dtype) * 100
    cache[:, :, new_table] = torch.randn(cache[:, :, new_table].shape, dtype=cache.dtype) * 100
    manager.swap_in("r", new_table).wait()
    manager.check_integrity()
    return new_table


@pytest.fixture
def make_manager(transport):
    """The in-process manager over the executor, or the kvmanager service's client with the
    executor served over gRPC (bytes through shared memory)."""
    stacks = []

    def make(executor, int8: bool):
        config = KVManagerConfig(0.01, int8=int8)
        if transport == "inprocess":
            return InProcessKVManager(config, executor, executor.model_info())
        stacks.append(KVManagerStack(executor, config))
        return stacks[-1].client

    yield make
    for stack in stacks:
        stack.stop()


def test_swapping_through_the_host_pool_leaves_greedy_tokens_unchanged(executor, make_manager):
    manager = make_manager(executor, int8=False)
    for text in PROMPTS:
        prompt = encode(executor, text)
        assert generate(executor, prompt, manager) == generate(executor, prompt)
    stats = manager.stats()
    assert stats.bytes_swapped_out == stats.bytes_swapped_in > 0
    assert stats.num_free_host_blocks == stats.num_host_blocks
    manager.close()


def test_int8_swapping_reports_token_agreement(executor, capsys, make_manager):
    manager = make_manager(executor, int8=True)
    agree = total = 0
    for text in PROMPTS:
        prompt = encode(executor, text)
        swapped, baseline = generate(executor, prompt, manager), generate(executor, prompt)
        # Tokens sampled before the swap cannot differ; after it, INT8 error may flip some.
        assert swapped[:SWAP_AFTER] == baseline[:SWAP_AFTER]
        assert len(swapped) == NEW_TOKENS
        agree += sum(a == b for a, b in zip(swapped[SWAP_AFTER:], baseline[SWAP_AFTER:]))
        total += NEW_TOKENS - SWAP_AFTER
    stats = manager.stats()
    assert stats.bytes_swapped_in > 0
    # The link carried the packed INT8 form, quantized by the executor before the copy
    # (blocks of 4 tokens: 4 code bytes + 0.5 of scales per channel against 8 of fp16).
    assert 0 < stats.link_bytes_out <= stats.bytes_swapped_out * 4.5 / 8
    manager.close()
    assert agree >= 0.9 * total
    with capsys.disabled():
        print(f"\nINT8 swap: {agree}/{total} greedy tokens after the swap agree "
              f"({agree / total:.0%}), opt-tiny, {len(PROMPTS)} prompts")
