"""A length-aware encoder: MiniLM fine-tuned on the served model's (prompt, log output length).

The stock sentence encoder places prompts by topic; two prompts on one topic can want replies
of 20 and 2,000 tokens. Fine-tuning it with a regression head on log length (the training of
the S3/SSJF proxy model, proxy.py) bends the space so that neighbours also agree on length;
ALISE then searches and trains its MLP in that space, and keeps learning online from the
served model's completions as before, at the stock encoder's cost per prompt.

The result is a sentence-transformers directory (Transformer → mean pooling → normalize, the
stock layout, new weights) with `lenserve_encoder.json` beside it, whose `id` tags every
vector the DB stores: a DB or an MLP built with one encoder is refused by another.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import time
import uuid

from services.predictor.embedder import META_FILE, default_encoder_path, encoder_id
from services.predictor.proxy import ProxyConfig, ProxyRegressor

MIN_RECORDS = 32
# The default fine-tune: a 64-token window on the first 4 of MiniLM's 6 layers, which costs
# about what the stock encoder costs at 32 tokens and ranks lengths better (README figures).
DEFAULT_WINDOW = 64
DEFAULT_LAYERS = 4
# `build` fine-tunes by default from this many records on: with ShareGPT's 8,885 it ranked
# held-out lengths better than the stock encoder (README), with Alpaca's 800 it did not.
AUTO_MIN_RECORDS = 2000
AUTO_EPOCHS = 2
# Weight files of the base model that the fine-tuned weights replace, and files not needed.
_NOT_COPIED = ("model.safetensors", "pytorch_model.bin", "onnx", "openvino", "README.md",
               ".gitattributes", META_FILE)


def fine_tune_encoder(prompts: list[str], lengths, out_dir: str,
                      config: ProxyConfig = ProxyConfig(max_seq_length=DEFAULT_WINDOW,
                                                        num_layers=DEFAULT_LAYERS),
                      extra_meta: dict | None = None, stop=None) -> str:
    """Fine-tune the encoder at config.encoder_path (stock MiniLM if None) on (prompt, length)
    pairs and save it to out_dir, with ``extra_meta`` in its metadata; returns the new
    encoder's id. ``stop``: see ``ProxyRegressor.fit``."""
    if len(prompts) != len(lengths):
        raise ValueError(f"{len(prompts)} prompts but {len(lengths)} lengths")
    if len(prompts) < MIN_RECORDS:
        raise ValueError(f"{len(prompts)} records are too few to fine-tune the encoder "
                         f"(at least {MIN_RECORDS})")
    t0 = time.perf_counter()
    proxy = ProxyRegressor(config).fit(list(prompts), [int(n) for n in lengths], stop)
    meta = {"id": uuid.uuid4().hex, "base": encoder_id(config.encoder_path),
            "num_records": len(prompts), "fit_s": round(time.perf_counter() - t0, 1),
            "training": dataclasses.asdict(config), **(extra_meta or {})}
    save_encoder(proxy, out_dir, meta)
    return meta["id"]


def save_encoder(proxy: ProxyRegressor, out_dir: str, meta: dict) -> None:
    """Write the fine-tuned encoder as a sentence-transformers directory, replacing out_dir in
    one rename so a reader never sees half of it."""
    base = proxy.config.encoder_path or default_encoder_path()
    out_dir = os.path.normpath(out_dir)
    tmp = out_dir + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(base, tmp, ignore=shutil.ignore_patterns(*_NOT_COPIED))
    proxy.encoder.save_pretrained(tmp)
    proxy.tokenizer.save_pretrained(tmp)
    st_config = os.path.join(tmp, "sentence_bert_config.json")
    settings = {}
    if os.path.exists(st_config):
        with open(st_config) as f:
            settings = json.load(f)
    settings["max_seq_length"] = proxy.config.max_seq_length
    with open(st_config, "w") as f:
        json.dump(settings, f, indent=2)
    with open(os.path.join(tmp, META_FILE), "w") as f:
        json.dump(meta, f, indent=2)
    old = out_dir + ".old"
    shutil.rmtree(old, ignore_errors=True)
    if os.path.exists(out_dir):
        os.rename(out_dir, old)
    os.rename(tmp, out_dir)
    shutil.rmtree(old, ignore_errors=True)
