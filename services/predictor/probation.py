"""A retrained MLP serves only once it has ranked the served model's own new completions at
least as well as the MLP it would replace.

A retrain weights the few observed completions far above the seed records (learning.py), and
an MLP fitted mostly to a few dozen records can rank worse than the one trained on thousands
of seed records: on the ALISE ShareGPT benchmark (3,000 disjoint seed records, the served
model's lengths the seed's own) the ranking of requests fell from Spearman 0.40 to 0.18 as the
predictor learnt online. So a retrained MLP is a candidate first: every completion observed
after it was trained is predicted, before the DB learns it, by the whole predictor with the
served MLP and with the candidate (retrieval and blending alike); these are held-out records
for both. Once ``probation_records`` were scored, the candidate replaces the served MLP if its
predictions rank them at least as well (Spearman), else it is dropped and the next retrain
tries again. Ranking is what length-aware schedulers use; scale is corrected apart (bias.py).
"""
from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field

import numpy as np

log = logging.getLogger(__name__)


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Rank correlation, ties given their mean rank; 0 where either side is constant."""
    ra, rb = _ranks(np.asarray(a, float)), _ranks(np.asarray(b, float))
    ra, rb = ra - ra.mean(), rb - rb.mean()
    den = float(np.sqrt((ra @ ra) * (rb @ rb)))
    return float(ra @ rb / den) if den > 0 else 0.0


def _ranks(x: np.ndarray) -> np.ndarray:
    order = np.argsort(x, kind="stable")
    ranks = np.empty(len(x))
    ranks[order] = np.arange(len(x), dtype=float)
    _, inverse, counts = np.unique(x, return_inverse=True, return_counts=True)
    sums = np.bincount(inverse, weights=ranks)
    return sums[inverse] / counts[inverse]


@dataclass
class Candidate:
    """A retrained MLP waiting for its verdict, and the held-out records scored so far."""

    weights: object  # mlp.MLPWeights (version 0 until served)
    data: object     # the TrainingSet it was trained on
    served: list = field(default_factory=list)  # log1p predictions with the served MLP
    mine: list = field(default_factory=list)    # with this candidate
    real: list = field(default_factory=list)    # log1p real lengths
    keys: set = field(default_factory=set)      # DB points scored: a prompt counts once


@dataclass(frozen=True)
class Verdict:
    accepted: bool
    served_rho: float
    candidate_rho: float
    records: int


class Probation:
    """Candidates per model (one at a time: a newer retrain replaces a waiting one)."""

    def __init__(self, min_records: int):
        self.min_records = min_records
        self._waiting: dict[str, Candidate] = {}
        self._lock = threading.Lock()

    def propose(self, model: str, weights, data) -> None:
        with self._lock:
            self._waiting[model] = Candidate(weights, data)

    def candidate(self, model: str) -> Candidate | None:
        return self._waiting.get(model)

    def drop(self, model: str) -> None:
        with self._lock:
            self._waiting.pop(model, None)

    def score(self, model: str, candidate: Candidate, served: np.ndarray, mine: np.ndarray,
              real: np.ndarray, keys) -> Verdict | None:
        """Add held-out records, one per DB point (``keys``: a flood of one prompt is one
        record); the verdict once enough were scored (the candidate then leaves probation),
        else None."""
        with self._lock:
            if self._waiting.get(model) is not candidate:
                return None  # replaced meanwhile
            for i, key in enumerate(keys):
                if key not in candidate.keys:
                    candidate.keys.add(key)
                    candidate.served.append(served[i])
                    candidate.mine.append(mine[i])
                    candidate.real.append(real[i])
            n = len(candidate.real)
            if n < self.min_records:
                return None
            del self._waiting[model]
        real_ = np.array(candidate.real)
        rho_s = spearman(np.array(candidate.served), real_)
        rho_c = spearman(np.array(candidate.mine), real_)
        return Verdict(rho_c >= rho_s, rho_s, rho_c, n)


def judge(predictor, model: str, vectors: np.ndarray, batch, real_log: np.ndarray,
          keys) -> None:
    """Score the MLP on probation for ``model`` (if any) on records neither MLP has seen
    (``batch``: the served predictor's analysis of them, made before the DB learnt them;
    ``keys``: the DB points they went to); serve it if it ranks them at least as well as the
    served one. Under the predictor's lock."""
    cand = predictor.probation.candidate(model)
    if cand is None:
        return
    mine = predictor._rows(model, vectors, batch.neighbours, None, cand.weights)
    verdict = predictor.probation.score(model, cand, batch.log_len, mine.log_len, real_log,
                                        keys)
    if verdict is None:
        return
    predictor.stats["retrains_served" if verdict.accepted else "retrains_dropped"] += 1
    log.info("retrained MLP of %s %s: Spearman %.3f against the served %.3f on %d new "
             "completions", model, "served" if verdict.accepted else "dropped",
             verdict.candidate_rho, verdict.served_rho, verdict.records)
    if verdict.accepted:
        w = cand.weights
        predictor.install_mlp(model, w.module, w.num_records, cand.data)


def offer(predictor, model: str, module, data) -> bool:
    """Put an MLP retrained on ``data`` on probation; False where it is served at once: no
    probation configured, no observed record in its training, or no MLP served yet."""
    if predictor.config.probation_records <= 0 or not data.num_observed \
            or predictor.mlps.get(model) is None:
        return False
    from services.predictor.mlp import MLPWeights
    predictor.probation.propose(model, MLPWeights(module, 0, len(data.vectors), data.seed_shift,
                                                  data.seed_share), data)
    return True
