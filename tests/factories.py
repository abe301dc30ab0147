"""Shared test factories: small Hugging Face checkpoints written to disk like real ones."""
from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig, OPTConfig

from services.executor.models.loader import preset_tokenizer
from services.executor.models.presets import (
    BOS_ID,
    EOS_ID,
    FAMILY_PRESETS,
    PAD_ID,
    TOKENIZER_VOCAB_SIZE,
)

# Wide random weights keep the top two logits well apart, so greedy decoding is decided by the
# model and not by float rounding between two implementations.
_BASE = {"vocab_size": TOKENIZER_VOCAB_SIZE, "pad_token_id": PAD_ID, "bos_token_id": BOS_ID,
         "eos_token_id": EOS_ID, "hidden_size": 64, "num_hidden_layers": 2,
         "num_attention_heads": 4, "max_position_embeddings": 1024}
_FAMILY = {
    "opt": (OPTConfig, {"ffn_dim": 256, "word_embed_proj_dim": 64, "init_std": 0.1}),
    "llama": (LlamaConfig, {"num_key_value_heads": 2, "intermediate_size": 128,
                            "initializer_range": 0.1, "tie_word_embeddings": False}),
}


def write_checkpoint(tmp_path: Path, family: str, seed: int = 0, tokenizer: bool = True,
                     **overrides) -> Path:
    """A random-weight float32 ``family`` checkpoint plus (unless ``tokenizer`` is False) the
    MiniLM tokenizer, in one dir. ``family``: "opt", "llama" or a family preset's name
    ("qwen3-tiny", ...), whose config it takes."""
    if family in FAMILY_PRESETS:
        base = FAMILY_PRESETS[family].hf_config().to_dict()
        config = AutoConfig.for_model(base.pop("model_type"), **{**base, **overrides})
    else:
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


def lay_out_hub_cache(cache: Path, model_id: str, checkpoint: Path) -> Path:
    """Put ``checkpoint``'s files into a Hugging Face hub cache at ``cache`` as the hub client
    does (``models--org--name/blobs`` plus a snapshot of links, ``refs/main`` naming it), so
    ``HF_HUB_CACHE=cache`` with HF_HUB_OFFLINE finds ``model_id`` there. Returns the snapshot."""
    import hashlib
    import os

    repo = Path(cache) / f"models--{model_id.replace('/', '--')}"
    commit = hashlib.sha1(model_id.encode()).hexdigest()
    snapshot = repo / "snapshots" / commit
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    snapshot.mkdir(parents=True, exist_ok=True)
    for f in sorted(Path(checkpoint).iterdir()):
        data = f.read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        os.symlink(os.path.relpath(blob, snapshot), snapshot / f.name)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(commit)
    return snapshot
