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


class DatasetFormatError(ValueError):
    """The file is not in the format its --dataset-name says."""


# What identifies each format: the keys of its records.
SIGNATURES = {"sharegpt": ({"conversations"}, {"prompt", "response"}),
              "alpaca": ({"instruction", "output"},)}
TITLES = {"sharegpt": "ShareGPT", "alpaca": "Alpaca"}
_SNIFF_CHARS = 1 << 20


def sniff(path: str) -> tuple[str | None, str, set[str]]:
    """(format name, layout, keys of the first record), from the file's head. The name is
    None for neither format, "" when the first record is too long to tell."""
    with _open(path) as f:
        head = f.read(_SNIFF_CHARS)
    text = head.lstrip()
    layout, text = ("a JSON array", text[1:].lstrip()) if text.startswith("[") \
        else ("JSON lines", text)
    try:
        first, end = json.JSONDecoder().raw_decode(text)
    except json.JSONDecodeError:
        return ("" if len(head) == _SNIFF_CHARS else None), \
            (layout if len(head) == _SNIFF_CHARS else "not JSON"), set()
    if layout == "JSON lines" and not text[end:].strip():
        layout = "one JSON object"
    keys = set(first) if isinstance(first, dict) else set()
    for name, signatures in SIGNATURES.items():
        if any(sig <= keys for sig in signatures):
            return name, layout, keys
    return None, layout, keys


def _read_rows(path: str, layout: str) -> list[dict]:
    with _open(path) as f:
        if layout == "JSON lines":
            return [json.loads(line) for line in f if line.strip()]
        return json.load(f)


def load_sharegpt(path: str, layout: str = "a JSON array") -> list[Sample]:
    """Conversation openings only: later pieces of split conversations start mid-dialogue."""
    rows = _read_rows(path, layout)
    if rows and "prompt" in rows[0]:  # first-turn extract: one opening per line
        return [Sample(r["prompt"], r["response"]) for r in rows
                if str(r.get("id", "_0")).endswith("_0") and r.get("turn_index", 0) == 0
                and r["prompt"].strip() and r["response"].strip()]
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


def load_alpaca(path: str, layout: str = "a JSON array") -> list[Sample]:
    rows = _read_rows(path, layout)
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
    if not Path(path).exists():
        raise FileNotFoundError(f"dataset file not found: {path}")
    found, layout, keys = sniff(path)
    if found not in (name, ""):
        raise DatasetFormatError(_mismatch(path, name, found, layout, keys))
    return LOADERS[name](path, layout)


def _mismatch(path: str, name: str, found: str | None, layout: str, keys: set[str]) -> str:
    seen = f"{layout}" + (f" whose first record has keys {sorted(keys)}" if keys else "")
    if found is not None:
        return (f"{path} looks like {TITLES[found]} data ({seen}), not {TITLES[name]}: use "
                f"--dataset-name {found}")
    expected = " or ".join(str(sorted(sig)) for sig in SIGNATURES[name])
    return (f"{path} is not {TITLES[name]} data: it is {seen}; {TITLES[name]} records have "
            f"the keys {expected}")


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
