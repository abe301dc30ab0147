"""How much the served model's own completions outrank seed data, and when to retrain.

Seed records are often another model's replies: useful as prior knowledge of which prompts
want long answers, systematically off in scale. Observed completions are the served model's
own. As they accumulate they take over, in retrieval (a seed neighbour weighs less than an
observed one) and in the MLP's training (observed records get most of the weight), along the
``observed_parity`` curve until seed_weight.py has learnt from them what a seed record is
worth (as much as an observed one, where the seed is the served model's own history).
"""
from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass

import numpy as np

from services.hardware import keep_torch_single_threaded
from services.predictor.config import PredictorConfig


log = logging.getLogger(__name__)


class TrainingStopped(Exception):
    """An MLP training run was asked to stop (its process is shutting down)."""


def seed_weight(num_observed: int, parity: int) -> float:
    """A seed neighbour's weight against an observed one: 1 with nothing observed, 1/2 at
    `parity` observed completions, falling towards 0 as they accumulate."""
    if parity <= 0:
        return 1.0
    return parity / (parity + max(0, num_observed))


def observed_share(num_observed: int, parity: int) -> float:
    """The observed records' share of the MLP's training weight (same curve, mirrored)."""
    return 1.0 - seed_weight(num_observed, parity)


def training_weights(observed: np.ndarray, parity: int, seed_w: float | None = None
                     ) -> np.ndarray:
    """Per-record weights, mean 1, that give the observed records `observed_share` of the
    total: a few hundred of the served model's replies then outweigh thousands of seed ones.
    With `seed_w` (learnt from finished requests, seed_weight.py) a seed record weighs
    `seed_w` of an observed one instead, as a seed neighbour does in retrieval."""
    observed = np.asarray(observed, bool)
    n_obs, n_seed = int(observed.sum()), int((~observed).sum())
    if n_obs == 0 or n_seed == 0:
        return np.ones(len(observed))
    share = observed_share(n_obs, parity) if seed_w is None \
        else n_obs / (n_obs + seed_w * n_seed)
    w = np.where(observed, share / n_obs, (1.0 - share) / n_seed)
    return w * len(w)


@dataclass(frozen=True)
class TrainingSet:
    """What the MLP is (re)trained on: seed targets moved by the seed shift, weights that
    favour observed records."""

    vectors: np.ndarray
    lengths: np.ndarray
    weights: np.ndarray
    observed: np.ndarray
    seed_shift: float
    seed_share: float

    @property
    def num_observed(self) -> int:
        return int(self.observed.sum())


def training_set(vectors: np.ndarray, lengths: np.ndarray, observed: np.ndarray,
                 seed_shift: float, parity: int, seed_w: float | None = None) -> TrainingSet:
    """A DB export as the MLP learns it: seed targets moved by the seed shift (log1p), the
    observed records weighted to their share."""
    weights = training_weights(observed, parity, seed_w)
    seed_share = float(weights[~observed].sum() / weights.sum()) if len(weights) else 1.0
    targets = np.expm1(np.log1p(lengths) + np.where(observed, 0.0, seed_shift))
    return TrainingSet(vectors, targets.astype(np.float32), weights, observed, seed_shift,
                       seed_share)


@dataclass(frozen=True)
class TrainedAt:
    """What the served MLP was trained with: observed points and the seed data's shift."""

    num_observed: int = 0
    seed_shift: float = 0.0


def retrain_due(config: PredictorConfig, num_observed: int, last: TrainedAt,
                seed_shift: float) -> str | None:
    """Why the MLP should be retrained now, or None.

    Observed points: first at retrain_first, then whenever they doubled, at least every
    retrain_every new ones. The seed shift: when it moved by retrain_shift since the MLP was
    trained (its seed targets were moved by the old estimate).
    """
    if config.retrain_every <= 0:
        return None
    new = num_observed - last.num_observed
    due_after = min(config.retrain_every, max(config.retrain_first, last.num_observed))
    if new >= max(1, due_after):
        return f"{num_observed} observed completions ({new} new)"
    moved = seed_shift - last.seed_shift
    if new >= config.retrain_min_new and abs(moved) >= config.retrain_shift:
        return f"seed data shift moved by {moved:+.2f} to {seed_shift:+.2f}"
    return None


class ThreadRetrainer:
    """Retrains in a thread of its own: ``observe``, and the predictions queued behind it on
    the same thread, never wait for a training run (seconds to tens of seconds on a CPU).
    The thread runs at the lowest CPU priority, so that an engine sharing the host keeps
    more of the CPU (on two cores a retrain beside an engine-like loop still cost it about a
    quarter of its rate, against almost half at normal priority), and trains on itself alone
    (``keep_torch_single_threaded``): an OpenMP team of its own would outlive the retrain and
    slow every later forward pass of an engine in this process. Usable as
    ``Predictor.retrain_hook``."""

    def __init__(self, predictor):
        self.predictor = predictor
        self._busy: dict[str, threading.Thread] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()

    def __call__(self, model: str) -> threading.Thread | None:
        with self._lock:
            if model in self._busy or self._stop.is_set():
                return None     # one retrain per model at a time; the next trigger catches up
            thread = self._busy[model] = threading.Thread(
                target=self._run, args=(model,), daemon=True, name=f"retrain-{model}")
        thread.start()
        return thread

    def _run(self, model: str) -> None:
        lowest_priority()
        keep_torch_single_threaded()
        try:
            version = self.predictor.retrain(model, stop=self._stop)
            log.info("MLP of %s retrained, version %d", model, version)
        except TrainingStopped:
            log.info("retrain of %s stopped: shutting down", model)
        except Exception as exc:  # noqa: BLE001 - the served MLP stays; log and move on
            log.warning("retrain of %s failed: %s", model, exc)
        finally:
            with self._lock:
                self._busy.pop(model, None)

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop the retrains in flight (within an epoch) and wait for them: a process must
        not exit while a thread is inside torch (it aborts)."""
        self._stop.set()
        with self._lock:
            threads = list(self._busy.values())
        for thread in threads:
            thread.join(timeout_s)


def lowest_priority() -> None:
    """Nice 19 for the calling thread (on Linux a thread has its own nice value); a no-op
    where the platform does not allow it."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
    except (AttributeError, OSError):
        pass


def state(predictor, model: str) -> dict:
    """What ``predictor`` (a core.Predictor) has learnt of a model so far."""
    from services.predictor.types import Source

    served = predictor.mlps.get(model)
    offsets = (predictor.seed_bias.shift(model, Source.RETRIEVAL.value),
               predictor.seed_bias.shift(model, Source.MLP.value))
    observed = predictor.num_observed(model)
    return {
        "observed": observed,
        "seed_weight": predictor.seed_weights.weight(model, observed),
        "seed_shift": {s.value: predictor.seed_bias.shift(model, s.value)
                       for s in (Source.RETRIEVAL, Source.MLP)},
        "residual_shift": {s.value: predictor.residuals.shift(model, s.value, offsets)
                           for s in Source},
        "mlp_version": 0 if served is None else served.version,
        "mlp_seed_share": None if served is None else served.seed_share,
        "stats": dict(predictor.stats),
    }
