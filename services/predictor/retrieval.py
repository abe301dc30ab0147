"""Retrieval arithmetic (pure): ALISE's similarity-weighted mean of the neighbours' lengths,
where seed neighbours count less than observed ones and are moved by the seed shift."""
from __future__ import annotations

import numpy as np

from services.predictor.store import Neighbours


def retrieval_weight(top: float, s0: float, width: float) -> float:
    """Weight of retrieval against the MLP: 1 at s0 and above, 0 at s0 - width and below,
    linear in between; a step at s0 when width is 0."""
    if width <= 0.0:
        return 1.0 if top >= s0 else 0.0
    return float(np.clip((top - (s0 - width)) / width, 0.0, 1.0))


def retrieval_log(nb: Neighbours, floor: float, seed_shift: float,
                  seed_w: float) -> tuple[float, float]:
    """Similarity-weighted mean log1p length of the neighbours at or above `floor`, and the
    seed neighbours' share of it; a seed neighbour's length is moved by the seed shift and
    its weight scaled by seed_w."""
    keep = nb.scores >= floor
    observed = nb.observed[keep]
    w = np.maximum(nb.scores[keep], 1e-6) * np.where(observed, 1.0, seed_w)
    y = np.log1p(nb.lengths[keep]) + np.where(observed, 0.0, seed_shift)
    return float(w @ y / w.sum()), float(w[~observed].sum() / w.sum())


def seed_retrieval_log(nb: Neighbours, floor: float) -> float:
    """What seed neighbours alone say, unshifted: the reference of the retrieval's seed
    shift (nan when no seed neighbour is close enough to be used)."""
    keep = (nb.scores >= floor) & ~nb.observed
    if not keep.any():
        return float("nan")
    w = np.maximum(nb.scores[keep], 1e-6)
    return float(w @ np.log1p(nb.lengths[keep]) / w.sum())
