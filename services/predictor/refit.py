"""Refit the encoder to the served model, from its own replies.

The encoder `build` fine-tunes bends the embedding space so that neighbours agree on reply
length, for the seed data's model. Observed replies of the served model then outweigh the
seed data in retrieval and in the MLP (learning.py), but both work in that fixed space. A
refit lets the served model's replies bend the space itself: on the Alpaca shift test
(README), after 500 observed replies, it took the median relative error from 0.438-0.445 to
0.414-0.425 on the length-aware encoder and from 0.510-0.529 to 0.467-0.500 on the stock
MiniLM, and Kendall's tau up by 0.02-0.12.

A refit (``Predictor.retrain`` runs it when one is due, in the retrain thread):

1. reads the text and length of every observed point, of every model (one encoder serves
   them all), each model's log lengths centred on its own mean: the encoder learns which
   prompts want longer replies, the bias correction and the MLP keep each model's scale;
2. fine-tunes the *base* encoder (the one the predictor started from, so that refits do not
   compound) on the most recent ``refit_max_records`` of them for ``refit_epochs``, into
   ``refit_dir``;
3. embeds every stored point's text with it and trains each model's MLPs on the new vectors;
4. then, under the predictor's lock, embeds the points that arrived meanwhile, rewrites the
   DB's vectors and swaps the encoder and the MLPs in together: a prediction meets the old
   space or the new one, never a mix.

Nothing of this runs on the predict or observe path. A refit that fails or is stopped leaves
the served encoder, DB and MLPs as they were.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import tempfile
import threading
import time

import numpy as np

from services.predictor import mlp
from services.predictor.embedder import Embedder, _meta, unload
from services.predictor.finetune import MIN_RECORDS, fine_tune_encoder
from services.predictor.learning import TrainingSet, TrainingStopped, training_set
from services.predictor.proxy import ProxyConfig
from services.predictor.store import StoredRecords, stable_order
from services.predictor.types import Source

log = logging.getLogger(__name__)
CURRENT = "current"  # in refit_dir: the name of the encoder the DB's vectors now come from
PREFIX = "refit-"


def due(config, num_observed: int, last: int) -> bool:
    """Whether a refit is due: at ``refit_first`` observed completions, then whenever their
    number doubled since the last refit (``last``: the count it was asked at)."""
    if config.refit_first <= 0 or config.refit_epochs <= 0:
        return False
    return num_observed >= max(config.refit_first, 2 * last)


class Schedule:
    """When refits are due (`due`), and whether one was asked for and not yet taken."""

    def __init__(self):
        self._asked_at = 0  # observed completions when the last refit was asked for
        self._pending = False
        self._lock = threading.Lock()

    def ask(self, config, num_observed: int) -> bool:
        """Ask for a refit if one is due and none is pending; whether it was asked."""
        with self._lock:
            if self._pending or not due(config, num_observed, self._asked_at):
                return False
            self._asked_at, self._pending = num_observed, True
        log.info("refitting the encoder: %d observed completions", num_observed)
        return True

    def take(self) -> bool:
        with self._lock:
            pending, self._pending = self._pending, False
            return pending


def base_encoder(path: str) -> str:
    """The encoder refits start from: the one a refitted encoder at `path` was refitted from
    (if it is still there), else `path` itself."""
    base = (_meta(path) or {}).get("refit_of")
    return base if base and os.path.isdir(base) else path


def current_refit(refit_dir: str | None) -> str | None:
    """The refitted encoder a predictor left in ``refit_dir`` for the next start, if any."""
    if not refit_dir:
        return None
    try:
        with open(os.path.join(refit_dir, CURRENT)) as f:
            path = os.path.join(refit_dir, f.read().strip())
    except OSError:
        return None
    return path if os.path.isdir(path) else None


def training_pairs(records: dict[str, StoredRecords], max_records: int
                   ) -> tuple[list[str], np.ndarray]:
    """The observed points' (text, length), each model's log lengths centred on its mean
    (moved to the pooled mean), the most recent ``max_records`` in all."""
    texts, logs, seen = [], [], []
    for rec in records.values():
        idx = np.flatnonzero(rec.observed)
        if len(idx):
            texts += [rec.texts[i] for i in idx]
            logs.append(np.log1p(rec.lengths[idx].astype(float)))
            seen.append(rec.last_seen[idx])
    if not texts:
        return [], np.zeros(0)
    pooled = np.concatenate(logs).mean()
    y = np.concatenate([y - y.mean() for y in logs]) + pooled
    recency = np.concatenate(seen)
    keep = np.sort(np.argsort(-recency, kind="stable")[:max_records])
    return [texts[i] for i in keep], np.maximum(1, np.round(np.expm1(y[keep]))).astype(int)


def refit_encoder(predictor, stop: threading.Event | None = None) -> str | None:
    """Refit the predictor's encoder (module docstring); returns the new encoder's id, or
    None where there is nothing to refit from (said in the log)."""
    config = predictor.config
    if not os.path.isdir(getattr(predictor.embedder, "path", None) or ""):
        log.info("encoder not refitted: %s is not a sentence encoder on disk",
                 type(predictor.embedder).__name__)
        return None
    if config.embedder.tail_chars > 0:
        log.info("encoder not refitted: prompts' tails are embedded, the DB keeps heads only")
        return None
    with predictor._lock:
        snapshot = {m: predictor.store.records(m) for m in predictor.store.models()}
    unkept = sum(t is None for rec in snapshot.values() for t in rec.texts)
    if unkept:
        log.warning("encoder not refitted: %d DB points keep no text to embed again (written "
                    "before points kept their text); rebuild the DB to refit", unkept)
        return None
    prompts, lengths = training_pairs(snapshot, config.refit_max_records)
    if len(prompts) < MIN_RECORDS:
        log.info("encoder not refitted: %d observed records with text", len(prompts))
        return None
    old, base = predictor.embedder, base_encoder(predictor.embedder.path)
    out_dir = refit_dir(predictor)
    out = os.path.join(out_dir, PREFIX + f"{time.time_ns():x}")
    t0 = time.perf_counter()
    new_id = fine_tune_encoder(
        prompts, lengths, out,
        ProxyConfig(encoder_path=base, epochs=config.refit_epochs,
                    max_seq_length=old.max_seq_length), {"refit_of": base}, stop)
    try:
        embedder = Embedder(dataclasses.replace(config.embedder, encoder_path=out,
                                                max_seq_length=old.max_seq_length),
                            config.max_prompt_chars)
        vectors = {m: dict(zip(rec.ids, _encode(embedder, rec.texts, stop)))
                   for m, rec in snapshot.items()}
        trained = {m: _train(predictor, m, rec, vectors[m], stop) for m, rec in snapshot.items()}
        with predictor._lock:
            for m in predictor.store.models():  # a model first seen meanwhile is all fresh
                now, done = predictor.store.records(m), vectors.setdefault(m, {})
                fresh = [i for i, pid in enumerate(now.ids) if pid not in done]
                done.update(zip([now.ids[i] for i in fresh],
                                _encode(embedder, [now.texts[i] for i in fresh])))
                predictor.store.revector(m, done, embedder.encoder_id)
            predictor.store.encoder = embedder.encoder_id
            predictor.embedder = embedder
            for m, parts in trained.items():
                if parts is not None:
                    _install(predictor, m, *parts)
    except BaseException:
        shutil.rmtree(out, ignore_errors=True)
        raise
    _point_at(out_dir, out, old.path)
    log.info("encoder refitted on %d observed records in %.0fs (base %s): %s", len(prompts),
             time.perf_counter() - t0, base, new_id)
    return new_id


def refit_dir(predictor) -> str:
    if predictor.config.refit_dir:
        os.makedirs(predictor.config.refit_dir, exist_ok=True)
        return predictor.config.refit_dir
    if predictor.refit_tmp is None:
        predictor.refit_tmp = tempfile.mkdtemp(prefix="lenserve-refit-")
    return predictor.refit_tmp


def _encode(embedder: Embedder, texts: list, stop: threading.Event | None = None,
            chunk: int = 256) -> np.ndarray:
    if any(t is None for t in texts):
        raise ValueError("a DB point keeps no text to embed again")
    out = []
    for i in range(0, len(texts), chunk):
        _check(stop)
        out.append(embedder.encode(texts[i:i + chunk]))
    return np.concatenate(out) if out else np.zeros((0, embedder.dim), np.float32)


def _train(predictor, model: str, rec: StoredRecords, vectors: dict, stop
           ) -> tuple | None:
    """(served MLP, seed-only MLP or None, training set) on the new vectors, or None where
    the model has too few points for an MLP."""
    if len(rec.ids) < predictor.config.mlp.min_train_records:
        return None
    v = np.stack([vectors[pid] for pid in rec.ids]).astype(np.float32)
    order = stable_order(v)
    data: TrainingSet = training_set(v[order], rec.lengths[order], rec.observed[order],
                                     predictor.seed_bias.shift(model, Source.MLP.value),
                                     predictor.config.observed_parity,
                                     predictor.seed_weights.learned(model))
    module = mlp.train(data.vectors, data.lengths, predictor.config.mlp, data.weights, stop)
    return module, predictor.seed_module(data, stop), data


def _install(predictor, model: str, module, seed: tuple | None, data: TrainingSet) -> None:
    """Serve MLPs trained on the refitted encoder's vectors (the caller swaps the encoder and
    the DB's vectors with them, under the predictor's lock); one waiting on probation was
    trained on the old encoder's vectors and is dropped."""
    if seed is not None:
        predictor.seed_mlps.swap(model, *seed)
    predictor.probation.drop(model)
    predictor.install_mlp(model, module, len(data.vectors), data)


def _check(stop: threading.Event | None) -> None:
    if stop is not None and stop.is_set():
        raise TrainingStopped("refit stopped")


def _point_at(out_dir: str, new: str, old: str) -> None:
    """Name the new encoder for the next start, and drop the previous refit's files."""
    tmp = os.path.join(out_dir, CURRENT + ".tmp")
    with open(tmp, "w") as f:
        f.write(os.path.basename(new))
    os.replace(tmp, os.path.join(out_dir, CURRENT))
    if os.path.dirname(os.path.normpath(old)) == os.path.normpath(out_dir) \
            and os.path.basename(old).startswith(PREFIX):
        shutil.rmtree(old, ignore_errors=True)
        unload(old)
