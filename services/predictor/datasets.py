"""Minimal loaders for the evaluation data: (prompt, reply) pairs with real replies."""
from __future__ import annotations

import gzip
import json
import random
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Sample:
    prompt: str
    reply: str


def _open(path: str):
    return gzip.open(path, "rt", encoding="utf-8") if path.endswith(".gz") \
        else open(path, encoding="utf-8")


def load_sharegpt(path: str) -> list[Sample]:
    """Conversation openings only: later pieces of split conversations start mid-dialogue."""
    if not Path(path).exists():
        raise FileNotFoundError(f"dataset file not found: {path}")
    name = path.removesuffix(".gz")
    if name.endswith(".jsonl"):
        with _open(path) as f:
            rows = [json.loads(line) for line in f if line.strip()]
        return [Sample(r["prompt"], r["response"]) for r in rows
                if r["id"].endswith("_0") and r.get("turn_index", 0) == 0
                and r["prompt"].strip() and r["response"].strip()]
    with _open(path) as f:
        rows = json.load(f)
    return [s for r in rows if (s := _opening(r)) is not None]


def _opening(record: dict) -> Sample | None:
    conv = record.get("conversations") or []
    if not str(record.get("id", "")).endswith("_0") or len(conv) < 2:
        return None
    first, second = conv[0], conv[1]
    if first.get("from") != "human" or second.get("from") != "gpt":
        return None
    if not first["value"].strip() or not second["value"].strip():
        return None
    return Sample(first["value"], second["value"])


def load_alpaca(path: str) -> list[Sample]:
    if not Path(path).exists():
        raise FileNotFoundError(f"dataset file not found: {path}")
    with _open(path) as f:
        rows = json.load(f)
    out = []
    for r in rows:
        prompt = r["instruction"] + ("\n\n" + r["input"] if r.get("input") else "")
        if prompt.strip() and r.get("output", "").strip():
            out.append(Sample(prompt, r["output"]))
    return out


LOADERS = {"sharegpt": load_sharegpt, "alpaca": load_alpaca}


def load(name: str, path: str) -> list[Sample]:
    if name not in LOADERS:
        raise ValueError(f"unknown dataset {name!r}; choose from {', '.join(LOADERS)}")
    return LOADERS[name](path)


def split(samples: list[Sample], num_train: int, num_test: int, seed: int = 0):
    """Disjoint train/test parts of one shuffled order. The test part is taken first, so a
    larger num_train adds training data without changing the test set."""
    if num_train + num_test > len(samples):
        raise ValueError(f"asked for {num_train}+{num_test} samples, the data set has "
                         f"{len(samples)}")
    order = list(range(len(samples)))
    random.Random(seed).shuffle(order)
    pick = [samples[i] for i in order]
    return pick[num_test:num_test + num_train], pick[:num_test]


def load_tokenizer(path: str | None = None):
    from transformers import AutoTokenizer

    from services.predictor.embedder import default_encoder_path

    return AutoTokenizer.from_pretrained(path or default_encoder_path())


def count_tokens(tokenizer, texts: list[str]) -> list[int]:
    """Reply lengths in the served model's tokenizer (no special tokens)."""
    enc = tokenizer(texts, add_special_tokens=False, verbose=False)
    return [len(ids) for ids in enc["input_ids"]]
