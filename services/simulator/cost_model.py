"""Cost models: seconds per iteration from its features.

``LinearCostModel`` is fitted to a measured profile: time is linear in the fed tokens, the
sampled sequences, the attended (query, key) pairs and the KV tokens read, plus hinges on the fed
tokens (piecewise-linear: dense layers run at a different efficiency on small and on large
batches). The fit minimises relative error, since iterations range from milliseconds to a
second and a long prefill must not drown out the decode steps that make up most of a run."""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np

from services.simulator.features import FEATURES, IterationFeatures


class CostModel(ABC):
    @abstractmethod
    def iteration_s(self, f: IterationFeatures) -> float:
        """Modelled seconds of one iteration with these features."""

    def describe(self) -> str:
        return type(self).__name__


@dataclass(frozen=True)
class FitReport:
    mean_abs_rel_error: float
    max_abs_rel_error: float
    num_points: int

    def __str__(self) -> str:
        return (f"fit over {self.num_points} points: mean |error| "
                f"{self.mean_abs_rel_error:.1%}, max |error| {self.max_abs_rel_error:.1%}")


@dataclass(frozen=True)
class LinearCostModel(CostModel):
    intercept_s: float
    coefficients: tuple[float, ...]          # one per FEATURES name, then one per knot
    knots: tuple[int, ...] = ()              # hinges max(0, tokens - knot)
    min_s: float = 1e-6                      # no iteration is free (and never negative)

    def row(self, f: IterationFeatures) -> list[float]:
        base = [float(getattr(f, name)) for name in FEATURES]
        return base + [max(0.0, f.tokens - k) for k in self.knots]

    def iteration_s(self, f: IterationFeatures) -> float:
        value = self.intercept_s + sum(c * x for c, x in zip(self.coefficients, self.row(f)))
        return max(value, self.min_s)

    def describe(self) -> str:
        terms = ", ".join(f"{n}={c:.3g}" for n, c in zip(self.names(), self.coefficients))
        return f"linear cost model (measured profile): intercept={self.intercept_s:.3g}s, {terms}"

    def names(self) -> list[str]:
        return list(FEATURES) + [f"tokens>{k}" for k in self.knots]


def fit_linear(features: list[IterationFeatures], seconds: list[float],
               knots: tuple[int, ...] = ()) -> tuple[LinearCostModel, FitReport]:
    """Least squares on relative error; features that never vary get a zero coefficient."""
    if len(features) != len(seconds) or not features:
        raise ValueError("a cost model needs at least one measured point")
    probe = LinearCostModel(0.0, (), knots)
    x = np.array([[1.0] + probe.row(f) for f in features])
    y = np.asarray(seconds, dtype=float)
    if (y <= 0).any():
        raise ValueError("measured iteration times must be > 0")
    weights = 1.0 / y
    coef, *_ = np.linalg.lstsq(x * weights[:, None], y * weights, rcond=None)
    model = LinearCostModel(float(coef[0]), tuple(float(c) for c in coef[1:]), knots)
    return model, fit_report(model, features, seconds)


def fit_report(model: CostModel, features: list[IterationFeatures],
               seconds: list[float]) -> FitReport:
    errors = [abs(model.iteration_s(f) - s) / s for f, s in zip(features, seconds)]
    return FitReport(float(np.mean(errors)), float(np.max(errors)), len(errors))
