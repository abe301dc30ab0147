"""How much the served model's own completions outrank seed data, and when to retrain.

Seed records are another model's replies: useful as prior knowledge of which prompts want
long answers, systematically off in scale. Observed completions are the served model's own.
As they accumulate they take over, in retrieval (a seed neighbour weighs less than an
observed one) and in the MLP's training (observed records get most of the weight).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from services.predictor.config import PredictorConfig


def seed_weight(num_observed: int, parity: int) -> float:
    """A seed neighbour's weight against an observed one: 1 with nothing observed, 1/2 at
    `parity` observed completions, falling towards 0 as they accumulate."""
    if parity <= 0:
        return 1.0
    return parity / (parity + max(0, num_observed))


def observed_share(num_observed: int, parity: int) -> float:
    """The observed records' share of the MLP's training weight (same curve, mirrored)."""
    return 1.0 - seed_weight(num_observed, parity)


def training_weights(observed: np.ndarray, parity: int) -> np.ndarray:
    """Per-record weights, mean 1, that give the observed records `observed_share` of the
    total: a few hundred of the served model's replies then outweigh thousands of seed ones."""
    observed = np.asarray(observed, bool)
    n_obs, n_seed = int(observed.sum()), int((~observed).sum())
    if n_obs == 0 or n_seed == 0:
        return np.ones(len(observed))
    share = observed_share(n_obs, parity)
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
                 seed_shift: float, parity: int) -> TrainingSet:
    """A DB export as the MLP learns it: seed targets moved by the seed shift (log1p), the
    observed records weighted to their share."""
    weights = training_weights(observed, parity)
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
