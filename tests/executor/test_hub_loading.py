"""``--model org/name`` through the Hugging Face hub cache, offline, as a real checkpoint ships:
sharded safetensors with an index, tied embeddings, a generation_config.json with several EOS
ids, a tokenizer with a chat template."""
from __future__ import annotations

import json

import pytest

from lenserve.bench.families import hf_greedy, lenserve_greedy, make_prompts
from services.executor.models.loader import build_hf_model, load_model
from services.executor.models.naming import ModelNotFoundError, hub_snapshot, model_tokenizer
from services.executor.models.presets import EOS_ID
from tests.factories import lay_out_hub_cache

MODEL_ID = "acme/tiny-chat"
TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}")


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    """qwen2.5-tiny (tied embeddings) saved in shards, its HF greedy tokens, in a hub cache."""
    from services.executor.models.loader import preset_tokenizer

    root = tmp_path_factory.mktemp("hub")
    src = root / "src"
    build_hf_model("qwen2.5-tiny").save_pretrained(src, max_shard_size="300KB")
    tok = preset_tokenizer()
    tok.chat_template = TEMPLATE
    tok.save_pretrained(src)
    prompts = make_prompts((5, 47))
    want = hf_greedy(src, prompts, 8)
    # Extra stop tokens: the 4th generated token of the first prompt (new in its output).
    stop = next(t for i, t in enumerate(want[0]) if i >= 3 and t not in want[0][:i])
    (src / "generation_config.json").write_text(json.dumps(
        {"eos_token_id": [EOS_ID, stop], "bos_token_id": 101}))
    lay_out_hub_cache(root / "cache", MODEL_ID, src)
    return root / "cache", prompts, want, stop


@pytest.fixture
def offline_cache(hub, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(hub[0]))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    hub_snapshot.cache_clear()
    yield hub
    hub_snapshot.cache_clear()


def test_hub_id_loads_from_the_cache_offline(offline_cache):
    _, prompts, want, stop = offline_cache
    loaded = load_model(MODEL_ID)
    snapshot = loaded.hf_config._name_or_path
    assert loaded.name == MODEL_ID and loaded.family == "qwen2"
    assert "snapshots" in str(snapshot)
    index = json.loads(open(f"{snapshot}/model.safetensors.index.json").read())
    assert len(set(index["weight_map"].values())) > 1           # really sharded
    assert "lm_head.weight" not in index["weight_map"] and loaded.model.tied
    assert loaded.eos_token_ids == (EOS_ID, stop) and loaded.eos_token_id == EOS_ID
    got = lenserve_greedy(MODEL_ID, prompts, 8, "torch")
    assert got == want


def test_every_generation_config_eos_id_stops_a_request(offline_cache):
    from lenserve.entrypoints.llm import LLM
    from lenserve_contract.sampling_params import SamplingParams

    _, prompts, want, stop = offline_cache
    with LLM(MODEL_ID, num_gpu_blocks=64, attention_backend="torch") as llm:
        out = llm.generate(prompt_token_ids=[prompts[0]],
                           sampling_params=SamplingParams(temperature=0.0, max_tokens=8))[0]
    tokens = list(out.outputs[0].token_ids)
    assert tokens == want[0][: want[0].index(stop) + 1]         # ended on the extra EOS id
    assert out.outputs[0].finish_reason == "stop"


def test_the_checkpoints_chat_template_renders_chat_prompts(offline_cache):
    from gateway.chat import ChatFormatter
    from gateway.config import GatewayConfig
    from gateway.protocol import ChatMessage

    formatter = ChatFormatter(model_tokenizer(MODEL_ID))
    assert formatter.uses_template
    prompt = formatter.render([ChatMessage(role="user", content="hi")],
                              GatewayConfig(served_model_name=MODEL_ID))
    assert prompt.text == "<|user|>hi\n<|assistant|>"


def test_a_hub_id_missing_offline_names_the_cache_and_the_offline_mode(offline_cache):
    with pytest.raises(ModelNotFoundError, match="acme/absent.*not in .*HF_HUB_OFFLINE"):
        load_model("acme/absent")
