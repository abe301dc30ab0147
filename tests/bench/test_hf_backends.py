"""hf-static and hf-cb on a tiny random Llama: exact output lengths and sensible timing."""
from __future__ import annotations

import dataclasses

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from lenserve.bench.backends import BackendOptions
from lenserve.bench.backends.hf_cb import HFContinuousBackend, page_size_arg
from lenserve.bench.backends.hf_static import HFStaticBackend, pad_left
from lenserve.bench.runner import RunnerConfig, replay
from lenserve.workloads.types import Workload

from .fakes import make_workload

QUIET = RunnerConfig(show_progress=False)


@pytest.fixture(scope="module")
def tiny_model():
    config = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         pad_token_id=0, bos_token_id=1, eos_token_id=2)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return LlamaForCausalLM(config).eval()


def lengths_workload(lengths, offsets=None) -> Workload:
    base = make_workload(offsets or [0.0] * len(lengths), prompt_len=5)
    return Workload("w", tuple(dataclasses.replace(r, output_len=n, prompt_token_ids=tuple(range(3, 3 + 4 + i)))
                               for i, (r, n) in enumerate(zip(base.requests, lengths))))


def test_pad_left_aligns_prompt_ends():
    ids, mask = pad_left([(5, 6, 7), (8,)], pad_id=0)
    assert ids.tolist() == [[5, 6, 7], [0, 0, 8]]
    assert mask.tolist() == [[1, 1, 1], [0, 0, 1]]


def test_static_batches_run_to_their_longest_and_return_together(tiny_model):
    backend = HFStaticBackend("hf-static", BackendOptions(hf_batch_size=2), model=tiny_model)
    backend.start()
    run = replay(backend, lengths_workload([3, 6, 2]), QUIET)
    first, second, third = run.records
    assert [r.num_output_tokens for r in run.records] == [3, 6, 2]
    assert all(r.success for r in run.records)
    # One batch: both results return at its end, after the longer request's last token.
    assert first.finish_time == second.finish_time >= second.token_times[-1]
    assert first.jct > first.e2el
    # The third request could not join the running batch.
    assert third.token_times[0] > first.finish_time


def test_continuous_batching_gives_exact_lengths(tiny_model):
    backend = HFContinuousBackend("hf-cb", BackendOptions(hf_cb_kv_tokens=1024, hf_cb_max_batch_tokens=256),
                                  model=tiny_model)
    backend.start()
    try:
        run = replay(backend, lengths_workload([4, 7, 1], offsets=[0.0, 0.0, 0.05]), QUIET)
        again = replay(backend, lengths_workload([2]), QUIET)   # reused across runs (sweeps)
    finally:
        backend.close()
    assert [r.num_output_tokens for r in run.records] == [4, 7, 1]
    for rec in run.records + again.records:
        assert rec.success
        assert rec.arrival_time <= rec.token_times[0]
        assert rec.token_times == sorted(rec.token_times) and rec.token_times[-1] <= rec.finish_time



def test_page_size_goes_by_the_name_the_installed_transformers_takes():
    class Before518:   # transformers <= 5.17
        def __init__(self, block_size: int = 256, num_blocks=None): ...

    class From518:     # page_size, with block_size kept as a deprecated alias
        def __init__(self, page_size: int = 256, num_blocks=None, block_size=None): ...

    assert page_size_arg(Before518) == "block_size"
    assert page_size_arg(From518) == "page_size"
