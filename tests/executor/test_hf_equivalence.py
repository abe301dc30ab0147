"""Greedy outputs are token-exact with Hugging Face ``generate`` under continuous batching:
mixed prompt lengths, chunked prefill, prefill and decode in one iteration, a pool too small
for all requests at once, for both model families and both attention backends."""
from __future__ import annotations

import importlib.util
import os
import random

import pytest
import torch

from services.executor.models.loader import build_hf_model, load_model
from services.executor.runner import InProcessExecutor
from tests.executor.continuous_batching import serve
from tests.factories import write_checkpoint

PROMPT_LENS = [1, 2, 3, 5, 8, 13, 17, 31, 47, 64, 100, 128, 150, 200, 256, 300]
MAX_TOKENS = 6
BLOCK_SIZE = 16


def _backends():
    triton_ok = importlib.util.find_spec("triton") is not None
    # Triton on these CPU tensors runs in the interpreter only (about a minute per family);
    # on a GPU machine the CUDA test below covers the compiled kernels.
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"
    return ["torch", "cpu", pytest.param("triton", marks=[pytest.mark.slow, pytest.mark.skipif(
        not (triton_ok and interpreted), reason="needs triton with TRITON_INTERPRET=1")])]


def make_prompts(seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    lens = PROMPT_LENS[:]
    rng.shuffle(lens)
    # Skip the low ids: the special tokens of the WordPiece vocabulary live there.
    return [[rng.randrange(1000, 30000) for _ in range(n)] for n in lens]


def hf_greedy(hf, prompt: list[int], eos: int, max_tokens: int = MAX_TOKENS) -> list[int]:
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = hf.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                          max_new_tokens=max_tokens, eos_token_id=eos, pad_token_id=0)
    return out[0, len(prompt):].tolist()


@pytest.fixture(scope="module", params=["opt", "llama"])
def checkpoint(request, tmp_path_factory):
    path = write_checkpoint(tmp_path_factory.mktemp(request.param), request.param)
    hf = build_hf_model(str(path))
    loaded = load_model(str(path))
    prompts = make_prompts()
    expected = [hf_greedy(hf, p, loaded.eos_token_id) for p in prompts]
    return loaded, prompts, expected


@pytest.mark.parametrize("backend", _backends())
def test_continuous_batching_matches_hf_generate(checkpoint, backend):
    if backend == "triton":
        pytest.importorskip("services.executor.attention.triton_backend")
    loaded, prompts, expected = checkpoint
    # 40 blocks hold about a third of all requests' KV: later requests must wait.
    executor = InProcessExecutor(loaded, block_size=BLOCK_SIZE, num_gpu_blocks=40,
                                 attention_backend=backend)
    outputs, stats = serve(executor, prompts, max_tokens=MAX_TOKENS, token_budget=64,
                           eos_token_id=loaded.eos_token_id)
    assert stats.waited > 0 and stats.mixed_iterations > 0 and stats.chunked_prompts > 0
    for prompt, got, want in zip(prompts, outputs, expected):
        assert got == want, f"prompt of {len(prompt)} tokens diverged"


def test_attention_waves_give_the_same_tokens(checkpoint):
    loaded, prompts, expected = checkpoint
    executor = InProcessExecutor(loaded, block_size=BLOCK_SIZE, num_gpu_blocks=40)
    outputs, _ = serve(executor, prompts, max_tokens=MAX_TOKENS, eos_token_id=loaded.eos_token_id,
                       waves_per_iteration=3)
    assert outputs == expected


@pytest.mark.parametrize("backend", ["torch", "cpu"])
def test_bfloat16_on_cpu_follows_hf_to_bf16_rounding(checkpoint, backend):
    """bf16 is the "auto" dtype on CPUs with native bf16, where no two implementations round
    alike: at every step of our greedy output, the token we chose must be HF's bf16 argmax or
    tie with it to a few bf16 steps of the logit (HF's own logits, fed our tokens so far)."""
    loaded, prompts, _ = checkpoint
    path = str(loaded.hf_config._name_or_path)
    hf, ours = build_hf_model(path, dtype="bfloat16"), load_model(path, dtype="bfloat16")
    executor = InProcessExecutor(ours, block_size=BLOCK_SIZE, num_gpu_blocks=40,
                                 attention_backend=backend)
    assert executor.kv.cache.dtype == torch.bfloat16
    outputs, _ = serve(executor, prompts, max_tokens=MAX_TOKENS, token_budget=64)
    exact = steps = 0
    for prompt, got in zip(prompts, outputs):
        with torch.no_grad():
            logits = hf(torch.tensor([prompt + got])).logits[0, len(prompt) - 1:].float()
        for step, token in enumerate(got):
            gap = float(logits[step].max() - logits[step, token])
            assert gap <= 0.05, f"prompt of {len(prompt)} tokens, step {step}: {gap:.3f} behind"
            exact += gap == 0.0
            steps += 1
    assert exact >= 0.9 * steps


@pytest.mark.parametrize("preset", ["opt-tiny", "llama-tiny"])
def test_presets_agree_with_their_hf_models(preset):
    hf, loaded = build_hf_model(preset, seed=3), load_model(preset, seed=3)
    executor = InProcessExecutor(loaded, num_gpu_blocks=64)
    prompts = make_prompts(seed=1)[:4]
    outputs, _ = serve(executor, prompts, max_tokens=4, eos_token_id=loaded.eos_token_id)
    assert outputs == [hf_greedy(hf, p, loaded.eos_token_id, max_tokens=4) for p in prompts]


def test_opt_variants_with_projection_and_post_norm(tmp_path):
    """OPT-350M style: embeddings narrower than the model, LayerNorm after each block."""
    path = write_checkpoint(tmp_path, "opt", word_embed_proj_dim=32, do_layer_norm_before=False)
    hf, loaded = build_hf_model(str(path)), load_model(str(path))
    executor = InProcessExecutor(loaded, num_gpu_blocks=64)
    prompts = make_prompts(seed=2)[:5]
    outputs, _ = serve(executor, prompts, max_tokens=4, eos_token_id=loaded.eos_token_id)
    assert outputs == [hf_greedy(hf, p, loaded.eos_token_id, max_tokens=4) for p in prompts]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_continuous_batching_on_cuda_matches_hf(checkpoint, backend):
    loaded, prompts, expected = checkpoint
    on_gpu = load_model(str(loaded.hf_config._name_or_path), device="cuda")
    executor = InProcessExecutor(on_gpu, block_size=BLOCK_SIZE, num_gpu_blocks=40,
                                 attention_backend=backend)
    outputs, _ = serve(executor, prompts, max_tokens=MAX_TOKENS, eos_token_id=loaded.eos_token_id)
    assert outputs == expected
