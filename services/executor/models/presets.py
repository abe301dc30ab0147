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
    family: str                     # the Hugging Face model_type: "opt", "llama", "qwen2", ...
    description: str
    config: dict = field(default_factory=dict)

    def hf_config(self) -> PretrainedConfig:
        from transformers import AutoConfig
        common = {"vocab_size": TOKENIZER_VOCAB_SIZE, "pad_token_id": PAD_ID,
                  "bos_token_id": BOS_ID, "eos_token_id": EOS_ID}
        return AutoConfig.for_model(self.family, **common, **self.config)


# The tiny family presets: each family's architecture features at hidden 64, 2 layers. Windows
# (24, 40) and the RoPE scalings' original lengths (64) are small so that short prompts reach
# past them and the features change the output.
_TINY = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "intermediate_size": 128, "max_position_embeddings": 2048,
         "initializer_range": 0.1, "tie_word_embeddings": False}
_GEMMA = {**_TINY, "head_dim": 16, "query_pre_attn_scalar": 16, "sliding_window": 24,
          "tie_word_embeddings": True}
FAMILY_PRESETS: dict[str, PresetSpec] = {
    "llama3-tiny": PresetSpec("llama", "Llama 3.1 style: RoPE scaling rope_type llama3", {
        **_TINY, "rope_parameters": {
            "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
            "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64}}),
    "qwen2.5-tiny": PresetSpec("qwen2", "Qwen2.5 style: QKV bias, tied embeddings", {
        **_TINY, "tie_word_embeddings": True}),
    "qwen2.5-yarn-tiny": PresetSpec("qwen2", "Qwen2.5 with YaRN RoPE scaling (factor 4)", {
        **_TINY, "max_position_embeddings": 256, "rope_parameters": {
            "rope_type": "yarn", "rope_theta": 1000000.0, "factor": 4.0,
            "original_max_position_embeddings": 64}}),
    "qwen3-tiny": PresetSpec("qwen3", "Qwen3 style: per-head q/k RMSNorm, head_dim 32 > "
                             "hidden/heads, tied embeddings", {
                                 **_TINY, "head_dim": 32, "tie_word_embeddings": True}),
    "mistral-tiny": PresetSpec("mistral", "Mistral style: sliding window 24 on every layer", {
        **_TINY, "sliding_window": 24}),
    "phi3-tiny": PresetSpec("phi3", "Phi-3 style: fused qkv_proj/gate_up_proj weights, "
                            "sliding window 40", {**_TINY, "sliding_window": 40}),
    "gemma2-tiny": PresetSpec("gemma2", "Gemma 2 style: GeGLU, scaled embeddings, sandwich "
                              "norms, window 24 / global layers, attention and logit "
                              "soft-capping (1.0, 5.0)", {
                                  **_GEMMA, "attn_logit_softcapping": 1.0,
                                  "final_logit_softcapping": 5.0}),
    "gemma3-tiny": PresetSpec("gemma3_text", "Gemma 3 style: q/k norm, window 24 / global "
                              "layers with their own RoPE (global: linear x8)", {
                                  **_GEMMA, "layer_types": ["sliding_attention",
                                                            "full_attention"],
                                  "rope_parameters": {
                                      "sliding_attention": {"rope_type": "default",
                                                            "rope_theta": 10000.0},
                                      "full_attention": {"rope_type": "linear", "factor": 8.0,
                                                         "rope_theta": 1000000.0}}}),
}


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
    **FAMILY_PRESETS,
}

def list_presets() -> list[str]:
    return sorted(PRESETS)
