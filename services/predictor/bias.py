"""Online bias correction: how far a model's real lengths sit from what was predicted.

A deployment seeds the predictor from another model's replies, and the served model may
answer 4× shorter or 2× longer on the same prompts. Per (model, source) we keep the residuals
log1p(real) - log1p(predicted) of recent completions. Their recency-weighted median is the
correction: a median, so a few absurd replies cannot swing it; recency-weighted, so it
follows a model whose verbosity drifts. Their recency-weighted upper quantile is the padding.

Each source's estimate is shrunk towards the model's pooled estimate (all sources together),
and that one towards 0, by a few pseudo-residuals: a source seen twice borrows the model's
shift instead of trusting two replies. A residual may carry a key (the DB point its prompt
merged into): a new residual with the same key replaces the old one, so a flood of one
prompt counts once.

A residual may also say how much of its prediction other estimates moved (`coefs`, e.g. the
seed-derived share of a prediction that the seed shift moves). It is stored as measured
without them and read with their current values (`offsets`): when the seed shift is refined,
yesterday's residuals describe today's predictions instead of counting the old error twice.
"""
from __future__ import annotations

import itertools
import threading
from collections import OrderedDict
from collections.abc import Hashable

import numpy as np

from services.predictor.config import BiasConfig

POOLED = ""  # the source name of a model's pooled window


def weighted_quantile(values: np.ndarray, weights: np.ndarray, q: float) -> float:
    """The smallest value whose cumulative weight reaches q of the total."""
    order = np.argsort(values, kind="stable")
    cum = np.cumsum(weights[order])
    i = int(np.searchsorted(cum, q * cum[-1], side="left"))
    return float(values[order][min(i, len(values) - 1)])


class ResidualWindow:
    """The last `window` residuals of one key; weight halves every `half_life` additions."""

    def __init__(self, config: BiasConfig):
        self.config = config
        self._seq = 0
        # key -> (seq, residual, weight, coefs); insertion order is age order.
        self._entries: OrderedDict[Hashable, tuple[int, float, float, tuple]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def add(self, residual: float, key: Hashable | None = None, weight: float = 1.0,
            coefs: tuple = ()) -> None:
        # A key seen before replaces its residual without ageing the others: a flood of one
        # prompt must not make everything else look old.
        if key is None or self._entries.pop(key, None) is None:
            self._seq += 1
        key = ("seq", self._seq) if key is None else key
        self._entries[key] = (self._seq, float(residual), float(weight), tuple(coefs))
        while len(self._entries) > self.config.window:
            self._entries.popitem(last=False)

    def restart_if_changed(self, offsets: tuple = ()) -> bool:
        """Drop all but the latest residuals when their median departs from the older ones'
        by more than chance allows: a step change (a new model behind the same name, a new
        system prompt) is then followed within a few dozen completions, not half-lives."""
        k = self.config.min_samples
        if len(self._entries) < 3 * k:
            return False
        res, _ = self.arrays(offsets)
        old, new = res[:-k], res[-k:]
        spread = 1.4826 * float(np.median(np.abs(old - np.median(old))))
        # 1.25 σ/√k: the standard error of a median of k normal residuals.
        if abs(float(np.median(new) - np.median(old))) <= max(
                self.config.change_threshold, 3.0 * 1.25 * spread / np.sqrt(k)):
            return False
        for key in list(self._entries)[:-k]:
            del self._entries[key]
        return True

    def arrays(self, offsets: tuple = ()) -> tuple[np.ndarray, np.ndarray]:
        """(residuals read with the current offsets, recency weights)."""
        if not self._entries:
            return np.zeros(0), np.zeros(0)
        seq, res, w, coefs = zip(*self._entries.values())
        res = np.array(res, float)
        if offsets:
            res = res - np.array([c or (0.0,) * len(offsets) for c in coefs]) @ np.array(offsets)
        return res, np.array(w) * 0.5 ** ((self._seq - np.array(seq)) / self.config.half_life)

    def median(self, prior: float, offsets: tuple = ()) -> float:
        res, w = self.arrays(offsets)
        # The prior is the oldest evidence: it fades as residuals arrive.
        prior_w = self.config.prior_weight * 0.5 ** (self._seq / self.config.half_life)
        return weighted_quantile(np.append(res, prior), np.append(w, prior_w), 0.5)

    def quantile(self, q: float, offsets: tuple = ()) -> float | None:
        if len(self._entries) < self.config.min_samples:
            return None
        return weighted_quantile(*self.arrays(offsets), q)


class BiasBook:
    """Residual windows keyed by (model, source), with estimates cached until the next add."""

    def __init__(self, config: BiasConfig = BiasConfig()):
        self.config = config
        self._windows: dict[tuple[str, str], ResidualWindow] = {}
        self._shift: dict[tuple, float | None] = {}  # estimates, until the model's next add
        # Re-entrant: a source's estimate reads the model's pooled one under the same lock.
        self._lock = threading.RLock()

    def add(self, model: str, source: str, residuals, keys=None, weight: float = 1.0,
            coefs=None, offsets: tuple = ()) -> None:
        """Residuals of one source; each also enters the model's pooled window. `offsets`:
        the current values the coefs multiply, to look for a step change."""
        keys = itertools.repeat(None) if keys is None else keys
        coefs = itertools.repeat(()) if coefs is None else coefs
        rows = list(zip(residuals, keys, coefs))
        with self._lock:
            for window in (self._window(model, source), self._window(model, POOLED)):
                for r, k, c in rows:
                    window.add(r, None if k is None else (source, k), weight, tuple(c))
                window.restart_if_changed(offsets)
            self._shift = {k: v for k, v in self._shift.items() if k[0] != model}

    def _window(self, model: str, source: str) -> ResidualWindow:
        return self._windows.setdefault((model, source), ResidualWindow(self.config))

    def shift(self, model: str, source: str = POOLED, offsets: tuple = ()) -> float:
        """The correction to add to a log1p prediction; 0 with nothing observed."""
        key = (model, source, offsets)
        if key in self._shift:
            return self._shift[key]
        with self._lock:
            window = self._windows.get((model, source))
            prior = 0.0 if source == POOLED else self.shift(model, POOLED, offsets)
            value = prior if window is None else window.median(prior, offsets)
            if len(self._shift) > 1024:  # offsets change as estimates do; keep the cache small
                self._shift.clear()
            self._shift[key] = value
            return value

    def quantile(self, model: str, source: str, q: float, offsets: tuple = ()) -> float | None:
        """The q-quantile of a source's residuals; None while it has too few."""
        key = (model, source, offsets, q)
        if key in self._shift:
            return self._shift[key]
        with self._lock:
            window = self._windows.get((model, source))
            value = None if window is None else window.quantile(q, offsets)
            self._shift[key] = value
            return value

    def count(self, model: str, source: str = POOLED) -> int:
        window = self._windows.get((model, source))
        return 0 if window is None else len(window)
