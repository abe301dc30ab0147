"""The predictor core (ALISE Algorithm 1): no sockets, no threads, no clock reads.

predict: embed → top-k in the model's DB → if the best similarity ≥ s0, the similarity-
weighted (geometric) mean of the neighbours' real lengths, else the MLP on the embedding, else
a safe default. Between s0 - blend_width and s0 the two are blended in log length, the
retrieval's weight rising linearly with the best similarity (blend_width 0: ALISE's hard
switch). observe: DB.update with the real length, plus a calibration residual.
"""
from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable, Sequence

import numpy as np

from services.predictor import mlp
from services.predictor.calibration import Calibrator
from services.predictor.config import PredictorConfig
from services.predictor.embedder import Embedder
from services.predictor.store import LengthStore, Neighbours
from services.predictor.types import Completion, ObserveResult, Prediction, PredictionError, Source

log = logging.getLogger(__name__)


class Predictor:
    def __init__(self, config: PredictorConfig, embedder: Embedder | None = None,
                 store: LengthStore | None = None,
                 retrain_hook: Callable[[str], None] | None = None):
        self.config = config
        self.embedder = embedder or Embedder(config.embedder, config.max_prompt_chars)
        self.store = store or LengthStore(config.store, self.embedder.dim,
                                         encoder=self.embedder.encoder_id)
        self.mlps = mlp.MLPSlot()
        self.calibrator = Calibrator(config.upper_quantile, config.calibration_window)
        # Called with a model name when retrain_every new records arrived; None retrains inline.
        self.retrain_hook = retrain_hook
        self._new_records: Counter[str] = Counter()
        self._tick = 0.0
        # Embedded Qdrant is not safe for a write racing a search; one lock keeps it simple.
        self._lock = threading.RLock()

    # ----- predict -----
    def predict(self, prompts: Sequence[str], model: str = "") -> list[Prediction]:
        model = model or self.config.default_model
        if err := self._check_model(model):
            return [self._default(model, err) for _ in prompts]
        out: list[Prediction | None] = [None] * len(prompts)
        valid = []
        for i, p in enumerate(prompts):
            if err := _check_prompt(p, "prompts"):
                out[i] = self._default(model, err)
            else:
                valid.append(i)
        for i, pred in zip(valid, self._predict_valid(model, [prompts[i] for i in valid])):
            out[i] = pred
        return out  # type: ignore[return-value]

    def _predict_valid(self, model: str, prompts: list[str]) -> list[Prediction]:
        if not prompts:
            return []
        try:
            vectors = self.embedder.encode(prompts)
        except Exception as exc:  # a broken encoder must not stop the service
            log.exception("embedding failed")
            return [self._default(model, PredictionError("INTERNAL", f"embedding failed: {exc}"))
                    ] * len(prompts)
        return self.predict_vectors(model, vectors)

    def predict_vectors(self, model: str, vectors: np.ndarray) -> list[Prediction]:
        neighbours, store_err = self._search(model, vectors)
        weights = self.mlps.get(model)
        mlp_lengths = weights.predict(vectors) if weights is not None else None
        preds = []
        for i, nb in enumerate(neighbours):
            mlp_len = None if mlp_lengths is None else float(mlp_lengths[i])
            preds.append(self._combine(model, nb, mlp_len, store_err))
        return preds

    def _search(self, model: str, vectors: np.ndarray):
        try:
            with self._lock:
                return self.store.search(model, vectors, self.config.top_k), None
        except Exception as exc:  # noqa: BLE001 - Qdrant down: fall back to the MLP or default
            log.warning("vector DB search failed: %s", exc)
            empty = Neighbours(np.zeros(0, np.float32), np.zeros(0, np.float32))
            return [empty] * len(vectors), PredictionError("UNAVAILABLE", f"vector DB: {exc}")

    def _combine(self, model, nb: Neighbours, mlp_len, store_err) -> Prediction:
        top = min(1.0, float(nb.scores[0])) if len(nb.scores) else 0.0
        s0, width = self.config.similarity_threshold, max(0.0, self.config.blend_width)
        # With no MLP to blend with, ALISE's hard switch at s0.
        w = 0.0 if not len(nb.scores) else retrieval_weight(top, s0, width) \
            if mlp_len is not None else float(top >= s0)
        if w > 0.0:
            keep = nb.scores >= s0 - width
            log_len = float(np.dot(nb.scores[keep], np.log1p(nb.lengths[keep]))
                            / nb.scores[keep].sum())
            if w < 1.0:
                log_len = w * log_len + (1.0 - w) * float(np.log1p(mlp_len))
            source = Source.RETRIEVAL if w >= 0.5 else Source.MLP
            return self._make(model, float(np.expm1(log_len)), source, top)
        if mlp_len is not None:
            return self._make(model, mlp_len, Source.MLP, top)
        err = store_err or PredictionError("UNKNOWN_MODEL", f"no length data yet for model "
                                           f"{model!r}", "model")
        return self._default(model, err, top)

    def _make(self, model, length, source: Source, top: float) -> Prediction:
        n = int(np.clip(round(length), 1, self.config.max_length))
        upper = min(self.calibrator.upper(model, source.value, n), self.config.max_length)
        return Prediction(n, source, top, upper)

    def _default(self, model, error: PredictionError, top: float = 0.0) -> Prediction:
        n = self.config.default_length
        upper = min(self.calibrator.upper(model, Source.DEFAULT.value, n), self.config.max_length)
        return Prediction(n, Source.DEFAULT, top, upper, error)

    def _check_model(self, model: str) -> PredictionError | None:
        if self.config.models and model not in self.config.models:
            return PredictionError("UNKNOWN_MODEL", f"unknown model {model!r}; served: "
                                   f"{', '.join(self.config.models)}", "model")
        return None

    # ----- observe (DB.update) -----
    def observe(self, records: Sequence[Completion]) -> ObserveResult:
        errors, by_model = [], {}
        for rec in records:
            model = rec.model or self.config.default_model
            err = self._check_model(model) or _check_prompt(rec.prompt, "prompt") \
                or _check_length(rec.num_output_tokens)
            if err:
                errors.append(PredictionError(err.code, f"{rec.request_id}: {err.message}",
                                              err.field))
            else:
                by_model.setdefault(model, []).append(rec)
        accepted = 0
        for model, recs in by_model.items():
            try:
                self._observe_model(model, recs)
                accepted += len(recs)
            except Exception as exc:  # noqa: BLE001 - Qdrant down: reject, keep serving
                log.warning("observe failed for %s: %s", model, exc)
                errors.extend(PredictionError("UNAVAILABLE", f"{r.request_id}: {exc}")
                              for r in recs)
        return ObserveResult(accepted, len(records) - accepted, tuple(errors))

    def _observe_model(self, model: str, recs: list[Completion]) -> None:
        vectors = self.embedder.encode([r.prompt for r in recs])
        real = np.array([r.num_output_tokens for r in recs], np.float32)
        with self._lock:
            for pred, length in zip(self.predict_vectors(model, vectors), real):
                self.calibrator.add(model, pred.source.value, pred.length, float(length))
            self.store.upsert(model, vectors, real, self._now(recs), observed=True)
        self._new_records[model] += len(recs)
        if self.config.retrain_every and self._new_records[model] >= self.config.retrain_every:
            self._new_records[model] = 0
            self._trigger_retrain(model)

    def _now(self, recs: list[Completion]) -> float:
        # Recency for eviction comes from the records themselves, not from a clock read here.
        self._tick = max([self._tick + 1e-6] + [r.finished_at for r in recs])
        return self._tick

    def _trigger_retrain(self, model: str) -> None:
        if self.retrain_hook is not None:
            self.retrain_hook(model)
            return
        try:
            self.retrain(model)
        except ValueError as exc:
            log.info("retrain of %s skipped: %s", model, exc)

    # ----- seeding, training, calibration -----
    def seed(self, model: str, prompts: Sequence[str], lengths: Sequence[int],
             now: float = 0.0) -> int:
        """Bulk-load (prompt, length) pairs from a data set as prior knowledge."""
        vectors = self.embedder.encode(list(prompts))
        with self._lock:
            return self.store.upsert(model, vectors, np.asarray(lengths, np.float32), now,
                                     observed=False)

    def export(self, model: str) -> tuple[np.ndarray, np.ndarray]:
        with self._lock:
            return self.store.export(model)

    def retrain(self, model: str) -> int:
        """Train the MLP from the DB's contents in-process and swap it in; returns the version."""
        vectors, lengths = self.export(model)
        return self.mlps.swap(model, mlp.train(vectors, lengths, self.config.mlp), len(vectors))

    def load_mlp(self, model: str, path: str) -> int:
        module, n = mlp.load(path, input_dim=self.embedder.dim,
                             encoder=self.embedder.encoder_id)
        return self.mlps.swap(model, module, n)

    def calibrate(self, model: str, prompts: Sequence[str], lengths: Sequence[int]) -> None:
        """Seed the residual windows from held-out (prompt, real length) pairs."""
        vectors = self.embedder.encode(list(prompts))
        for pred, real in zip(self.predict_vectors(model, vectors), lengths):
            self.calibrator.add(model, pred.source.value, pred.length, float(real))


def retrieval_weight(top: float, s0: float, width: float) -> float:
    """Weight of retrieval against the MLP: 1 at s0 and above, 0 at s0 - width and below,
    linear in between; a step at s0 when width is 0."""
    if width <= 0.0:
        return 1.0 if top >= s0 else 0.0
    return float(np.clip((top - (s0 - width)) / width, 0.0, 1.0))


def _check_prompt(prompt, field: str) -> PredictionError | None:
    if not isinstance(prompt, str):
        return PredictionError("INVALID_ARGUMENT", f"prompt must be a string, got "
                               f"{type(prompt).__name__}", field)
    if not prompt.strip():
        return PredictionError("INVALID_ARGUMENT", "prompt is empty", field)
    return None


def _check_length(n) -> PredictionError | None:
    if not isinstance(n, (int, np.integer)) or n < 0:
        return PredictionError("INVALID_ARGUMENT", f"num_output_tokens must be a non-negative "
                               f"integer, got {n!r}", "num_output_tokens")
    return None
