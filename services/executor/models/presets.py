"""Built-in models: real architecture shapes with seeded random weights, for tests and benchmarks.

Every preset uses the WordPiece tokenizer of all-MiniLM-L6-v2 (shipped with a pip package, so
it works offline); the vocabulary size and special token ids are set to match it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:   # importing transformers' model configs costs seconds: only when building
    from transformers import PretrainedConfig

TOKENIZER_VOCAB_SIZE = 30522
# [PAD], [CLS], [SEP] of the MiniLM vocabulary; [SEP] ends a text, so it is the EOS.
PAD_ID, BOS_ID, EOS_ID = 0, 101, 102


@dataclass(frozen=True)
class PresetSpec:
    family: str                     # "opt" | "llama"
    description: str
    config: dict = field(default_factory=dict)

    def hf_config(self) -> PretrainedConfig:
        from transformers import LlamaConfig, OPTConfig
        cls = {"opt": OPTConfig, "llama": LlamaConfig}[self.family]
        common = {"vocab_size": TOKENIZER_VOCAB_SIZE, "pad_token_id": PAD_ID,
                  "bos_token_id": BOS_ID, "eos_token_id": EOS_ID}
        return cls(**common, **self.config)


PRESETS: dict[str, PresetSpec] = {
    "opt-tiny": PresetSpec("opt", "2-layer OPT, hidden 64, for tests", {
        "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "ffn_dim": 256,
        "word_embed_proj_dim": 64, "max_position_embeddings": 2048, "init_std": 0.1}),
    "llama-tiny": PresetSpec("llama", "2-layer Llama with GQA, hidden 64, for tests", {
        "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "intermediate_size": 128, "max_position_embeddings": 2048,
        "initializer_range": 0.1, "tie_word_embeddings": False}),
    "opt-125m": PresetSpec("opt", "OPT-125M shapes (12 layers, hidden 768)", {
        "hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
        "ffn_dim": 3072, "word_embed_proj_dim": 768, "max_position_embeddings": 2048}),
    "smollm-360m": PresetSpec("llama", "SmolLM-360M shapes (32 layers, hidden 960, GQA 15/5)", {
        "hidden_size": 960, "num_hidden_layers": 32, "num_attention_heads": 15,
        "num_key_value_heads": 5, "intermediate_size": 2560, "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": True}),
}

def list_presets() -> list[str]:
    return sorted(PRESETS)
