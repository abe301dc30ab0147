"""Length-prediction metrics: ALISE bucket accuracy, relative error, rank agreement."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import stats


@dataclass(frozen=True)
class LengthMetrics:
    bucket_accuracy: float
    mean_rel_error: float
    median_rel_error: float
    kendall_tau: float
    spearman_rho: float
    under_predicted: float
    upper_covered: float  # fraction with real length ≤ upper quantile (nan if none given)


def buckets(lengths: np.ndarray, width: int, num_buckets: int) -> np.ndarray:
    """ALISE: evenly divided bins; the last bin is open-ended."""
    return np.minimum(np.asarray(lengths) // width, num_buckets - 1).astype(int)


def length_metrics(pred, real, upper=None, width: int = 100,
                   num_buckets: int = 10) -> LengthMetrics:
    pred, real = np.asarray(pred, float), np.asarray(real, float)
    if pred.shape != real.shape or len(pred) < 2:
        raise ValueError("need two equally long arrays of at least 2 lengths")
    rel = np.abs(pred - real) / np.maximum(real, 1.0)
    acc = float(np.mean(buckets(pred, width, num_buckets) == buckets(real, width, num_buckets)))
    cov = float("nan") if upper is None else float(np.mean(real <= np.asarray(upper, float)))
    tau, rho = _rank_agreement(pred, real)
    return LengthMetrics(acc, float(rel.mean()), float(np.median(rel)), tau, rho,
                         float(np.mean(pred < real)), cov)


def _rank_agreement(pred: np.ndarray, real: np.ndarray) -> tuple[float, float]:
    # A constant predictor (the global mean) carries no rank information: 0, not nan.
    if np.ptp(pred) == 0 or np.ptp(real) == 0:
        return 0.0, 0.0
    return float(stats.kendalltau(pred, real).statistic), float(stats.spearmanr(pred, real).statistic)


def latency_percentiles(seconds: list[float]) -> tuple[float, float]:
    ms = np.asarray(seconds) * 1e3
    return float(np.percentile(ms, 50)), float(np.percentile(ms, 99))
