"""How much a seed neighbour is worth against an observed one, learnt from finished requests.

Seed records may be another model's replies (systematically off in scale, which the seed
shift corrects, and perhaps in which prompts want long answers) or the served model's own
history (as good as what it serves now). A fixed curve (``observed_parity``: a seed neighbour
weighs half an observed one after 25 completions, a twentieth after 500) is right for the
first and throws the second away: on ShareGPT seeded with 3,000 ShareGPT records, learning
from the benchmark's own completions took the rank correlation of ALISE's predictions from
0.49 (no learning) to 0.41.

So the weight is fitted. Each finished request brings the neighbours its prompt had before it
was stored and its true length; over the most recent of them, the weight is the one of a fixed
grid under which the similarity-weighted mean log length of those neighbours (seed lengths
moved by the seed shift, as retrieval reads them) is closest to the truth, in squared log
error. A completion whose neighbours are all seed records, or all observed, does not depend on
the weight and is not kept. Until ``min_records`` informative completions have been seen, the
fixed curve stands.
"""
from __future__ import annotations

from collections import deque

import numpy as np

from services.predictor import learning
from services.predictor.store import Neighbours
from services.predictor.types import Source

# Candidate weights of a seed neighbour against an observed one (1: equal).
GRID = np.array([1.0, 0.5, 0.25, 0.1, 0.05, 0.02, 0.01])


class SeedWeightFit:
    """The fitted seed weight of one model's DB (``weight`` is None until enough data)."""

    def __init__(self, window: int, min_records: int, refit_every: int = 16):
        self.min_records = min_records
        self.refit_every = refit_every
        self._kept: deque[tuple[np.ndarray, np.ndarray, np.ndarray, float]] = deque(
            maxlen=window)
        self._new = 0
        self.weight: float | None = None

    def __len__(self) -> int:
        return len(self._kept)

    def add(self, nb: Neighbours, real_log: float) -> bool:
        """Keep a finished request's neighbours if the weight changes what they predict."""
        observed = np.asarray(nb.observed, bool)
        if not observed.any() or observed.all():
            return False
        self._kept.append((np.maximum(np.asarray(nb.scores, float), 1e-6),
                           np.log1p(np.asarray(nb.lengths, float)), observed, float(real_log)))
        self._new += 1
        return True

    def refit(self, seed_shift: float, force: bool = False) -> float | None:
        """Fit the weight again once ``refit_every`` completions were kept since the last fit
        (or at once with ``force``); returns the weight in force."""
        if len(self._kept) < self.min_records or not (force or self._new >= self.refit_every):
            return self.weight
        self._new = 0
        k = max(len(s) for s, _, _, _ in self._kept)
        scores, logs = np.zeros((len(self._kept), k)), np.zeros((len(self._kept), k))
        observed, real = np.zeros((len(self._kept), k), bool), np.zeros(len(self._kept))
        for i, (s, y, o, r) in enumerate(self._kept):
            scores[i, :len(s)], logs[i, :len(s)], observed[i, :len(s)], real[i] = s, y, o, r
        # retrieval.retrieval_log's arithmetic (no floor: every neighbour found), for every
        # record and GRID weight at once: (grid, records, neighbours); padding has score 0.
        logs = logs + np.where(observed, 0.0, seed_shift)
        w = scores[None] * np.where(observed[None], 1.0, GRID[:, None, None])
        pred = (w * logs[None]).sum(-1) / w.sum(-1)
        self.weight = float(GRID[int(np.argmin(((pred - real[None]) ** 2).mean(-1)))])
        return self.weight


class SeedWeights:
    """Per model of the DB: the fitted seed weight, or the ``observed_parity`` curve until
    there is one (``seed_weight_min_records`` 0: always the curve)."""

    def __init__(self, config):
        self.config = config
        self._fits: dict[str, SeedWeightFit] = {}

    def weight(self, model: str, num_observed: int) -> float:
        learned = self.learned(model)
        if learned is not None:
            return learned
        return learning.seed_weight(num_observed, self.config.observed_parity)

    def learned(self, model: str) -> float | None:
        fit = self._fits.get(model)
        return None if fit is None else fit.weight

    def observe(self, model: str, neighbours, real_log: np.ndarray, seed_bias) -> None:
        """Finished requests: each one's neighbours before it was stored, its log1p length;
        ``seed_bias`` (a bias.BiasBook) holds the seed shift that retrieval applies."""
        cfg = self.config
        if cfg.seed_weight_min_records <= 0:
            return
        fit = self._fits.get(model)
        if fit is None:
            fit = self._fits[model] = SeedWeightFit(cfg.seed_weight_window,
                                                    cfg.seed_weight_min_records)
        for nb, r in zip(neighbours, real_log):
            fit.add(nb, float(r))
        fit.refit(seed_bias.shift(model, Source.RETRIEVAL.value))
