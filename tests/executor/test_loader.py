"""Loading presets and Hugging Face checkpoint directories; clear errors for bad input."""
from __future__ import annotations

import json

import pytest
import torch

from lenserve_contract.sampling_params import InvalidRequestError
from services.executor.models.llama import LlamaForCausalLM
from services.executor.models.loader import (
    ModelNotFoundError,
    NoTokenizer,
    build_hf_model,
    load_model,
)
from services.executor.models.opt import OPTForCausalLM
from services.executor.models.presets import EOS_ID, PRESETS, list_presets
from tests.factories import write_checkpoint


@pytest.mark.parametrize("family,cls", [("opt", OPTForCausalLM), ("llama", LlamaForCausalLM)])
def test_loads_a_checkpoint_directory(tmp_path, family, cls):
    path = write_checkpoint(tmp_path, family, max_position_embeddings=512)
    loaded = load_model(str(path))
    assert isinstance(loaded.model, cls) and loaded.family == family
    assert loaded.max_model_len == 512 and loaded.eos_token_id == EOS_ID
    assert loaded.tokenizer("hello world")["input_ids"][-1] == EOS_ID


def test_checkpoint_weights_equal_hf_weights(tmp_path):
    path = write_checkpoint(tmp_path, "llama")
    hf, ours = build_hf_model(str(path)), load_model(str(path)).model
    hf_q = hf.model.layers[1].self_attn.q_proj.weight
    ours_q = ours.layers[1].self_attn.qkv_proj.weight[: hf_q.shape[0]]
    assert torch.equal(hf_q, ours_q)
    assert torch.equal(hf.lm_head.weight, ours.lm_head.weight)


def test_unknown_model_names_the_problem_and_the_presets(tmp_path):
    with pytest.raises(ModelNotFoundError) as err:
        load_model(str(tmp_path / "no-such-model"))
    assert isinstance(err.value, InvalidRequestError) and err.value.code == "unknown_model"
    assert "no-such-model" in str(err.value)
    assert all(name in str(err.value) for name in list_presets())


@pytest.mark.parametrize("model_type", ["gpt2", "no-such-type-transformers-knows"])
def test_unsupported_family_is_refused_naming_the_supported_ones(tmp_path, model_type):
    (tmp_path / "config.json").write_text(json.dumps(
        {"model_type": model_type, "architectures": ["SomethingForCausalLM"]}))
    with pytest.raises(InvalidRequestError) as err:
        load_model(str(tmp_path))
    message = str(err.value)
    assert model_type in message and "SomethingForCausalLM" in message
    assert err.value.code == "unsupported_model"
    for supported in ("qwen3 (Qwen3ForCausalLM)", "gemma2 (Gemma2ForCausalLM)",
                      "mistral (MistralForCausalLM)", "phi3 (Phi3ForCausalLM)", "opt"):
        assert supported in message


def test_unsupported_rope_scaling_is_refused(tmp_path):
    path = write_checkpoint(tmp_path, "llama")
    config = json.loads((path / "config.json").read_text())
    config["rope_scaling"] = {"rope_type": "dynamic", "factor": 4.0}
    config.pop("rope_parameters", None)
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="'dynamic' is not supported.*llama3, yarn"):
        load_model(str(path))


def test_presets_are_seeded_and_the_big_one_has_300m_to_1b_parameters():
    a, b, c = (load_model("opt-tiny", seed=s).model for s in (0, 0, 1))
    assert torch.equal(a.embed_tokens.weight, b.embed_tokens.weight)
    assert not torch.equal(a.embed_tokens.weight, c.embed_tokens.weight)
    with torch.device("meta"):
        big = LlamaForCausalLM(PRESETS["smollm-360m"].hf_config())
    assert 300e6 <= sum(p.numel() for p in big.parameters()) <= 1e9


def test_unknown_dtype_is_refused():
    with pytest.raises(InvalidRequestError, match="float8"):
        load_model("opt-tiny", dtype="float8")


@pytest.mark.parametrize("native_bf16, want", [(True, torch.bfloat16), (False, torch.float32)])
def test_auto_dtype_is_bf16_only_on_cpus_that_compute_it_natively(monkeypatch, native_bf16, want):
    from services.executor.models import loader

    monkeypatch.setattr(loader, "cpu_has_native_bf16", lambda: native_bf16)
    assert loader.resolve_dtype("auto", "cuda") == "bfloat16"
    assert loader.resolve_dtype("float32", "cpu") == "float32"   # an explicit choice stays
    loaded = load_model("opt-tiny", dtype="auto")
    assert loaded.dtype == want and next(loaded.model.parameters()).dtype == want


def test_checkpoint_without_tokenizer_files_loads_without_a_tokenizer(tmp_path):
    path = write_checkpoint(tmp_path, "llama", tokenizer=False)
    tokenizer = load_model(str(path)).tokenizer
    assert isinstance(tokenizer, NoTokenizer) and tokenizer.decode([5, 6]) == ""
    with pytest.raises(InvalidRequestError, match="no tokenizer files.*prompt_token_ids"):
        tokenizer.encode("hello")


def test_skip_tokenizer_init_loads_no_tokenizer(tmp_path):
    path = write_checkpoint(tmp_path, "opt")
    assert isinstance(load_model(str(path), skip_tokenizer_init=True).tokenizer, NoTokenizer)
    assert isinstance(load_model("opt-tiny", skip_tokenizer_init=True).tokenizer, NoTokenizer)
    assert not isinstance(load_model(str(path)).tokenizer, NoTokenizer)


@pytest.mark.parametrize("device,match", [("gpu0", "unknown device"),
                                          ("cuda:64", "not available")])
def test_unusable_device_is_refused_before_loading(device, match):
    with pytest.raises(InvalidRequestError, match=match):
        load_model("opt-tiny", device=device)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_without_cuda_is_refused():
    with pytest.raises(InvalidRequestError, match="device 'cuda' is not available"):
        load_model("opt-tiny", device="cuda")


def test_tokenizer_source_follows_the_files_it_is_built_from(tmp_path):
    from services.executor.models.naming import tokenizer_source
    assert tokenizer_source("opt-125m") == tokenizer_source("llama-tiny")   # one preset tokenizer
    assert tokenizer_source(str(tmp_path / "nowhere")) is None
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "tokenizer.json").write_text("{}")
    before = tokenizer_source(str(tmp_path))
    assert before is not None and before == tokenizer_source(str(tmp_path))
    (tmp_path / "tokenizer.json").write_text('{"changed": true}')
    assert tokenizer_source(str(tmp_path)) != before
