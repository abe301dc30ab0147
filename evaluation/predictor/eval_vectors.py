"""Vectors of bulk-embedded prompts reused across the runs of `lenserve predictor eval`.

An eval embeds thousands of seed prompts per predictor it builds, and the shift test builds
several (per scale, observed-only). With the same encoder the vectors are the same, so the
bulk encodes (seeding, calibration, tuning: `encode(..., cache=False)`) are remembered here,
in memory and, with a directory, in one file per encoder for later runs. The served paths
(`predict` and `observe` embed with `cache=True`) always run the encoder: every timing the
eval prints still includes embedding.
"""
from __future__ import annotations

import hashlib
import logging
import os

import numpy as np

from services.predictor.config import EmbedderConfig
from services.predictor.embedder import Embedder

log = logging.getLogger(__name__)
KEY_BYTES = 16  # Embedder._key digests


class VectorReuse:
    """Embedders whose bulk encodes are remembered, per encoder identity."""

    def __init__(self, directory: str | None = None):
        if directory is not None and os.path.exists(directory) and not os.path.isdir(directory):
            raise ValueError(f"--vector-cache {directory!r} is a file, not a directory")
        self.directory = directory
        self._memos: dict[str, dict[bytes, np.ndarray]] = {}
        self._dirty: set[str] = set()

    def embedder(self, config: EmbedderConfig, max_prompt_chars: int) -> Embedder:
        base = Embedder(config, max_prompt_chars)
        ident = identity(base)
        if ident not in self._memos:
            self._memos[ident] = self._load(ident, base.dim)
        return _Remembering(base, self._memos[ident], lambda: self._dirty.add(ident))

    def save(self) -> None:
        if self.directory is None:
            return
        os.makedirs(self.directory, exist_ok=True)
        for ident in sorted(self._dirty):
            memo = self._memos[ident]
            keys = np.frombuffer(b"".join(memo), np.uint8).reshape(len(memo), KEY_BYTES)
            path = self._file(ident)
            tmp = path + ".tmp.npz"
            np.savez(tmp, identity=np.array(ident), keys=keys,
                     vectors=np.stack(list(memo.values())).astype(np.float32))
            os.replace(tmp, path)
            log.info("%d vectors kept in %s", len(memo), path)
        self._dirty.clear()

    def _file(self, ident: str) -> str:
        return os.path.join(self.directory,
                            hashlib.sha1(ident.encode()).hexdigest()[:16] + ".npz")

    def _load(self, ident: str, dim: int) -> dict[bytes, np.ndarray]:
        if self.directory is None or not os.path.exists(self._file(ident)):
            return {}
        with np.load(self._file(ident)) as f:
            if str(f["identity"]) != ident or f["vectors"].shape[1:] != (dim,):
                log.warning("%s holds vectors of another encoder; not used", self._file(ident))
                return {}
            return {bytes(k): v for k, v in zip(f["keys"], f["vectors"])}


def identity(embedder: Embedder) -> str:
    """Everything a vector depends on besides the prompt (a fine-tune's id is new each time,
    so vectors of one fine-tune are never read for another)."""
    c = embedder.config
    return "|".join(map(str, (embedder.encoder_id, os.path.realpath(embedder.path),
                              embedder.max_seq_length, embedder.precision, c.tail_chars,
                              embedder.max_prompt_chars, embedder.packed)))


class _Remembering:
    """An Embedder whose cache=False encodes are looked up in, and added to, a memo."""

    def __init__(self, base: Embedder, memo: dict[bytes, np.ndarray], touched):
        self._base = base
        self._memo = memo
        self._touched = touched

    def __getattr__(self, name):
        return getattr(self._base, name)

    def encode(self, prompts: list[str], cache: bool = False) -> np.ndarray:
        if cache or not prompts:
            return self._base.encode(prompts, cache=cache)
        keys = [self._base._key(p) for p in prompts]
        missing = list(dict.fromkeys(k for k in keys if k not in self._memo))
        if missing:
            first = {k: i for i, k in reversed(list(enumerate(keys)))}
            fresh = self._base.encode([prompts[first[k]] for k in missing])
            self._memo.update(zip(missing, fresh.copy()))
            self._touched()
        return np.stack([self._memo[k] for k in keys])
