"""Retrieval arithmetic (pure): ALISE's similarity-weighted mean of the neighbours' lengths,
where seed neighbours count less than observed ones and are moved by the seed shift, and how
it combines with the MLP."""
from __future__ import annotations

import numpy as np

from services.predictor.config import PredictorConfig
from services.predictor.store import Neighbours
from services.predictor.types import Source


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


def widen(nb: Neighbours, top_k: int, mlp_log: float | None, weight: float,
          seed_shift: float, seed_w: float) -> tuple[Neighbours, float | None, float]:
    """(ALISE's top_k of ``nb``, the MLP's log length averaged with the mean of all of
    ``nb`` at ``weight``, the seed share of that mean's part): the wide neighbourhood ranks
    where the MLP alone is a weak ranker. Nothing changes with no MLP, no neighbour or
    ``weight`` 0."""
    top = Neighbours(nb.scores[:top_k], nb.lengths[:top_k], nb.observed[:top_k])
    if mlp_log is None or weight <= 0.0 or not len(nb.scores):
        return top, mlp_log, 0.0
    wide, share = retrieval_log(nb, -np.inf, seed_shift, seed_w)
    return top, (1.0 - weight) * mlp_log + weight * wide, weight * share


def seed_retrieval_log(nb: Neighbours, floor: float) -> float:
    """What seed neighbours alone say, unshifted: the reference of the retrieval's seed
    shift (nan when no seed neighbour is close enough to be used)."""
    keep = (nb.scores >= floor) & ~nb.observed
    if not keep.any():
        return float("nan")
    w = np.maximum(nb.scores[keep], 1e-6)
    return float(w @ np.log1p(nb.lengths[keep]) / w.sum())


def combine(config: PredictorConfig, nb: Neighbours, mlp_log: float | None, mlp_share: float,
            seed_shift: float, seed_w: float) -> tuple:
    """(log1p length, source, top similarity, seed share of retrieval, of the MLP) of one
    prompt from its neighbours (best first, up to max(top_k, wide_k)) and the MLP's answer."""
    widened = mlp_log is not None and len(nb.scores) > 0 and config.wide_weight > 0.0
    nb, mlp_log, wide_share = widen(nb, config.top_k, mlp_log, config.wide_weight,
                                    seed_shift, seed_w)
    if widened:  # the MLP's part, and its seed share, shrink by the wide mean's weight
        mlp_share *= 1.0 - config.wide_weight
    top = min(1.0, float(nb.scores[0])) if len(nb.scores) else 0.0
    s0, width = config.similarity_threshold, max(0.0, config.blend_width)
    # With no MLP to blend with, ALISE's hard switch at s0.
    w = 0.0 if not len(nb.scores) else retrieval_weight(top, s0, width) \
        if mlp_log is not None else float(top >= s0)
    if w > 0.0:
        log_len, share = retrieval_log(nb, s0 - width, seed_shift, seed_w)
        if w < 1.0:
            log_len = w * log_len + (1.0 - w) * mlp_log
        source = Source.RETRIEVAL if w >= 0.5 else Source.MLP
        return log_len, source, top, w * share + (1.0 - w) * wide_share, (1.0 - w) * mlp_share
    if mlp_log is not None:
        return mlp_log, Source.MLP, top, wide_share, mlp_share
    return float(np.log1p(config.default_length)), Source.DEFAULT, top, 0.0, 0.0
