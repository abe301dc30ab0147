"""Shared test factories: small Hugging Face checkpoints written to disk like real ones."""
from __future__ import annotations

from pathlib import Path

import torch
from transformers import (
    AutoModelForCausalLM,
    Gemma2Config,
    Gemma3TextConfig,
    LlamaConfig,
    MistralConfig,
    OPTConfig,
    Phi3Config,
    Qwen2Config,
    Qwen3Config,
)

from services.executor.models.loader import preset_tokenizer
from services.executor.models.presets import BOS_ID, EOS_ID, PAD_ID, TOKENIZER_VOCAB_SIZE

# Wide random weights keep the top two logits well apart, so greedy decoding is decided by the
# model and not by float rounding between two implementations.
_BASE = {"vocab_size": TOKENIZER_VOCAB_SIZE, "pad_token_id": PAD_ID, "bos_token_id": BOS_ID,
         "eos_token_id": EOS_ID, "hidden_size": 64, "num_hidden_layers": 2,
         "num_attention_heads": 4, "max_position_embeddings": 1024}
_LLAMA = {"num_key_value_heads": 2, "intermediate_size": 128, "initializer_range": 0.1,
          "tie_word_embeddings": False}
# Each family's real architecture features at a tiny size. Windows (24, 40) and the RoPE
# scalings' original lengths (64) are small so that the test prompts reach past them.
_FAMILY = {
    "opt": (OPTConfig, {"ffn_dim": 256, "word_embed_proj_dim": 64, "init_std": 0.1}),
    "llama": (LlamaConfig, _LLAMA),
    "llama3": (LlamaConfig, {**_LLAMA, "rope_parameters": {
        "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 64}}),
    "qwen2": (Qwen2Config, {**_LLAMA, "tie_word_embeddings": True}),
    "qwen2-yarn": (Qwen2Config, {**_LLAMA, "rope_parameters": {
        "rope_type": "yarn", "rope_theta": 1000000.0, "factor": 4.0,
        "original_max_position_embeddings": 64}}),
    "qwen3": (Qwen3Config, {**_LLAMA, "head_dim": 32, "tie_word_embeddings": True}),
    "mistral": (MistralConfig, {**_LLAMA, "sliding_window": 24}),
    "phi3": (Phi3Config, {**_LLAMA, "sliding_window": 40}),
    "gemma2": (Gemma2Config, {**_LLAMA, "head_dim": 16, "query_pre_attn_scalar": 16,
                              "sliding_window": 24, "attn_logit_softcapping": 5.0,
                              "final_logit_softcapping": 5.0, "tie_word_embeddings": True}),
    "gemma3": (Gemma3TextConfig, {**_LLAMA, "head_dim": 16, "query_pre_attn_scalar": 16,
                                  "sliding_window": 24, "tie_word_embeddings": True,
                                  "layer_types": ["sliding_attention", "full_attention"],
                                  "rope_parameters": {
                                      "sliding_attention": {"rope_type": "default",
                                                            "rope_theta": 10000.0},
                                      "full_attention": {"rope_type": "linear", "factor": 8.0,
                                                         "rope_theta": 1000000.0}}}),
}
# The table's families: what each exercises.
FAMILY_FEATURES = {
    "llama": "GQA, plain RoPE",
    "llama3": "RoPE scaling rope_type llama3",
    "qwen2": "QKV bias, tied embeddings",
    "qwen2-yarn": "QKV bias, YaRN RoPE scaling",
    "qwen3": "per-head q/k RMSNorm, head_dim > hidden/heads, tied embeddings",
    "mistral": "sliding window 24 on every layer",
    "phi3": "fused qkv_proj/gate_up_proj in the checkpoint, sliding window 40",
    "gemma2": "GeGLU, scaled embeddings, sandwich norms, alternating window 24/global, "
              "attention and final logit soft-capping",
    "gemma3": "q/k norm, local/global layers with their own RoPE (global: linear x8), window 24",
}


def write_checkpoint(tmp_path: Path, family: str, seed: int = 0, tokenizer: bool = True,
                     **overrides) -> Path:
    """A random-weight float32 ``family`` checkpoint plus (unless ``tokenizer`` is False) the
    MiniLM tokenizer, in one dir."""
    config_cls, extra = _FAMILY[family]
    config = config_cls(**{**_BASE, **extra, **overrides})
    path = Path(tmp_path) / f"{family}-checkpoint"
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(path)
    if tokenizer:
        preset_tokenizer().save_pretrained(path)
    return path
