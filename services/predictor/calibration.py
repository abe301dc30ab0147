"""Calibrated upper quantile: how much longer than predicted replies really turn out.

EconoServe pads a prediction by a fixed ratio (10-20%, tuned per data set). We keep a rolling
window of log(real / predicted) per model and source and pad by its q-quantile instead, so the
padding follows the predictor's actual error on the served model's traffic.
"""
from __future__ import annotations

from collections import deque

import numpy as np

# Below this many residuals a quantile is noise; pad by EconoServe's ShareGPT sweet spot.
MIN_SAMPLES = 20
UNCALIBRATED_PAD = 0.15


class Calibrator:
    def __init__(self, quantile: float, window: int):
        if not 0.0 < quantile < 1.0:
            raise ValueError(f"upper_quantile must be in (0, 1), got {quantile}")
        self.quantile = quantile
        self.window = window
        self._residuals: dict[tuple[str, str], deque] = {}

    def add(self, model: str, source: str, predicted: float, real: float) -> None:
        key = (model, source)
        buf = self._residuals.setdefault(key, deque(maxlen=self.window))
        buf.append(float(np.log1p(real) - np.log1p(predicted)))

    def count(self, model: str, source: str) -> int:
        return len(self._residuals.get((model, source), ()))

    def offset(self, model: str, source: str) -> float | None:
        """The q-quantile of log1p(real) - log1p(predicted), or None while uncalibrated."""
        buf = self._residuals.get((model, source))
        if buf is None or len(buf) < MIN_SAMPLES:
            return None
        return float(np.quantile(np.fromiter(buf, float), self.quantile))

    def upper(self, model: str, source: str, predicted: int) -> int:
        off = self.offset(model, source)
        if off is None:
            return int(np.ceil(predicted * (1.0 + UNCALIBRATED_PAD)))
        # Never below the point prediction: this bound is what the scheduler pads up to.
        return max(predicted, int(np.ceil(np.expm1(np.log1p(predicted) + off))))
