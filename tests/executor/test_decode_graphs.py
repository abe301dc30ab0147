"""Decode iterations replayed from CUDA graphs give the tokens eager iterations give.

GPU only: batches of every size up to past the largest bucket (which falls back to eager),
padding rows, both model families, float32 and bfloat16, under continuous batching with a
pool too small for all requests at once.
"""
from __future__ import annotations

import random

import pytest
import torch

from lenserve_contract.sampling_params import SamplingParams
from services.executor.decode_graphs import buckets_up_to
from services.executor.models.loader import load_model
from services.executor.runner import InProcessExecutor
from services.executor.types import ExecutorInput, ScheduledSequence
from tests.executor.continuous_batching import serve


def test_buckets_cover_every_batch_size_up_to_the_largest():
    assert buckets_up_to(5) == [1, 2, 4, 5]
    assert buckets_up_to(256)[-1] == 256
    for n in range(1, 300):
        assert any(b >= n for b in buckets_up_to(300))


def _prompts(seed: int, count: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(1000, 30000) for _ in range(rng.randrange(1, 90))]
            for _ in range(count)]


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("preset", ["llama-tiny", "opt-tiny"])
def test_graph_replay_gives_the_eager_tokens(preset):
    """float32: padded graph rows compute exactly what the eager batch computes."""
    loaded = load_model(preset, device="cuda", dtype="float32", seed=5)
    prompts = _prompts(seed=7, count=23)
    outputs = {}
    for graphs in (False, True):
        executor = InProcessExecutor(loaded, num_gpu_blocks=90, attention_backend="triton",
                                     cuda_graphs=graphs, max_graph_batch=12)
        outputs[graphs], _ = serve(executor, prompts, max_tokens=12, token_budget=48)
        if graphs:
            assert executor.graphs is not None and executor.graphs.graphs, "no graph was used"
            # The scratch block is not one the scheduler can hand out.
            assert executor.kv.scratch_block == executor.kv.num_blocks == 90
    assert outputs[True] == outputs[False]


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("preset", ["llama-tiny", "smollm-360m"])
def test_bfloat16_graph_logits_match_eager(preset):
    """bfloat16: a padded batch may take other GEMM kernels, so logits agree to rounding,
    and the sampled tokens are read from the graph's own greedy outputs."""
    loaded = load_model(preset, device="cuda", dtype="bfloat16", seed=5)
    prompts = _prompts(seed=9, count=5)
    ex = {g: InProcessExecutor(loaded, num_gpu_blocks=64, attention_backend="triton",
                               cuda_graphs=g) for g in (False, True)}
    params = SamplingParams(temperature=0.0)
    tables = [list(range(i * 8, i * 8 + 8)) for i in range(len(prompts))]
    prefill = [ScheduledSequence(str(i), p, 0, t, True, params)
               for i, (p, t) in enumerate(zip(prompts, tables))]
    first = {g: e.execute(ExecutorInput(0, prefill)).sampled for g, e in ex.items()}
    assert first[True] == first[False]          # prefill runs eagerly in both
    decode = [ScheduledSequence(str(i), [first[True][str(i)]], len(p), t, True, params)
              for i, (p, t) in enumerate(zip(prompts, tables))]
    logits = {g: e.forward_logits(ExecutorInput(1, decode))[0].float()
              for g, e in ex.items()}
    assert ex[True]._replayed and not ex[False]._replayed
    torch.testing.assert_close(logits[True], logits[False], rtol=3e-2, atol=3e-2)
    tokens, logprobs = ex[True].graphs.greedy(len(decode))
    assert tokens == logits[True].argmax(-1).tolist()
    want = torch.log_softmax(logits[True], -1).gather(1, torch.tensor(tokens, device="cuda")[:, None])
    assert logprobs == pytest.approx(want[:, 0].tolist(), abs=1e-4)


@pytest.mark.gpu
@needs_cuda
def test_graphs_are_off_for_a_backend_that_syncs():
    loaded = load_model("llama-tiny", device="cuda")
    executor = InProcessExecutor(loaded, num_gpu_blocks=8, attention_backend="torch")
    assert executor.graphs is None and executor.kv.scratch_block is None
