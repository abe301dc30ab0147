"""Every family preset is token-exact with Hugging Face ``generate`` on every attention backend,
served by the engine from a saved checkpoint (chunked prefill beside decodes, 8-token blocks,
prompts past the sliding windows and the RoPE scalings' original lengths); and the scenario
exercises each family's feature: without it, lenserve's tokens leave Hugging Face's."""
from __future__ import annotations

import json
import os
import shutil

import pytest

from lenserve.bench.families import (
    compare,
    hf_greedy,
    lenserve_greedy,
    make_prompts,
    write_preset_checkpoint,
)
from services.executor.models.presets import FAMILY_PRESETS

PRESETS = ["llama-tiny", *FAMILY_PRESETS]
MAX_TOKENS = 6
# Triton runs interpreted on a CPU: a few seconds per family; the sliding-window and
# soft-capping families are the ones whose kernels differ, the others only cost time.
_TRITON_FAST = {"mistral-tiny", "gemma2-tiny"}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    cache: dict = {}

    def get(preset):
        if preset not in cache:
            path = write_preset_checkpoint(preset, tmp_path_factory.mktemp("families"))
            prompts = make_prompts()
            cache[preset] = (path, prompts, hf_greedy(path, prompts, MAX_TOKENS))
        return cache[preset]
    return get


def _cases():
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"
    for preset in PRESETS:
        yield pytest.param(preset, "torch", id=f"{preset}-torch")
        yield pytest.param(preset, "cpu", id=f"{preset}-cpu")
        marks = [pytest.mark.skipif(not interpreted, reason="needs TRITON_INTERPRET=1 on CPU")]
        if preset not in _TRITON_FAST:
            marks.append(pytest.mark.slow)
        yield pytest.param(preset, "triton", id=f"{preset}-triton", marks=marks)


@pytest.mark.parametrize("preset,backend", list(_cases()))
def test_family_is_token_exact_with_hf_generate(reference, preset, backend):
    path, prompts, want = reference(preset)
    got = lenserve_greedy(path, prompts, MAX_TOKENS, backend)
    row = compare(preset, "", backend, "cpu", prompts, want, got, 0.0)
    assert row.ok, row.first_divergence


def _without(path, tmp_path, patch: dict):
    """A copy of the checkpoint whose config.json lacks a feature (same weights)."""
    copy = tmp_path / "without"
    shutil.copytree(path, copy)
    config = json.loads((copy / "config.json").read_text())
    config.update(patch)
    (copy / "config.json").write_text(json.dumps(config))
    return copy


@pytest.mark.parametrize("preset,patch", [
    ("mistral-tiny", {"sliding_window": None}),
    ("phi3-tiny", {"sliding_window": None}),
    ("gemma2-tiny", {"attn_logit_softcapping": None}),
    ("gemma2-tiny", {"layer_types": ["full_attention", "full_attention"]}),
    ("llama3-tiny", {"rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}}),
    ("qwen2.5-yarn-tiny", {"rope_parameters": {"rope_type": "default",
                                               "rope_theta": 1000000.0}}),
    # Local layers on the global layers' base: one rope for all would not do.
    ("gemma3-tiny", {"rope_parameters": {
        "sliding_attention": {"rope_type": "default", "rope_theta": 1000000.0},
        "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0}}}),
    ("gemma3-tiny", {"layer_types": ["full_attention", "full_attention"]}),
])
def test_the_prompts_exercise_the_feature(reference, tmp_path, preset, patch):
    path, prompts, want = reference(preset)
    got = lenserve_greedy(_without(path, tmp_path, patch), prompts, MAX_TOKENS, "torch")
    assert got != want, f"{preset} without {sorted(patch)} still matches: the test cannot fail"


def test_gemma2_final_logits_are_soft_capped_as_hf(reference):
    """A cap never changes the argmax, so tokens cannot show it: the logits do."""
    import torch

    from lenserve_contract.sampling_params import SamplingParams
    from services.executor.models.loader import build_hf_model, load_model
    from services.executor.runner import InProcessExecutor
    from services.executor.types import ExecutorInput, ScheduledSequence

    path, prompts, _ = reference("gemma2-tiny")
    prompt = prompts[2]
    with torch.no_grad():
        want = build_hf_model(str(path))(torch.tensor([prompt])).logits[0, -1]
    executor = InProcessExecutor(load_model(str(path)), block_size=8, num_gpu_blocks=16)
    seq = ScheduledSequence("r", prompt, 0, list(range(-(-len(prompt) // 8))), True,
                            SamplingParams(temperature=0.0), 0)
    got = executor.forward_logits(ExecutorInput(1, [seq]))[0][0]
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    cap = executor.net.arch.final_softcap
    assert got.abs().max() < cap
    uncapped = torch.atanh(got / cap) * cap
    assert (uncapped - got).abs().max() > 0.1     # the cap moves this prompt's logits


def test_partial_rotary_phi_checkpoint_is_token_exact(tmp_path, monkeypatch):
    """Phi-4-mini style: RoPE on the first half of each head only, the rest passed through."""
    from services.executor.models import presets

    config = presets.FAMILY_PRESETS["phi3-tiny"].config
    spec = presets.PresetSpec("phi3", "partial rotary", {**config, "rope_parameters": {
        "rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}})
    monkeypatch.setitem(presets.PRESETS, "phi3-partial-test", spec)
    path = write_preset_checkpoint("phi3-partial-test", tmp_path)
    assert json.loads((path / "config.json").read_text())["rope_parameters"][
        "partial_rotary_factor"] == 0.5
    prompts = make_prompts((5, 47))
    want = hf_greedy(path, prompts, MAX_TOKENS)
    assert lenserve_greedy(path, prompts, MAX_TOKENS, "torch") == want
    full = _without(path, tmp_path, {"rope_parameters": {"rope_type": "default",
                                                         "rope_theta": 10000.0}})
    assert lenserve_greedy(full, prompts, MAX_TOKENS, "torch") != want


def test_qwen2_sliding_layers_from_layer_types(tmp_path):
    """Qwen2's use_sliding_window: the layers ``layer_types`` names slide, the others do not."""
    from services.executor.models.loader import load_model
    from tests.factories import write_checkpoint

    path = write_checkpoint(tmp_path, "qwen2.5-tiny", use_sliding_window=True, sliding_window=24,
                            max_window_layers=1,
                            layer_types=["full_attention", "sliding_attention"])
    assert load_model(str(path)).model.arch.windows == (0, 24)
    prompts = make_prompts((5, 47))
    want = hf_greedy(path, prompts, MAX_TOKENS)
    assert lenserve_greedy(path, prompts, MAX_TOKENS, "cpu") == want
    full = _without(path, tmp_path, {"layer_types": ["full_attention"] * 2})
    assert lenserve_greedy(full, prompts, MAX_TOKENS, "torch") != want
