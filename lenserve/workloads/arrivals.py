"""Arrival offsets (seconds after the start of a run) for N requests.

Synthetic arrivals follow ``vllm bench serve``: inter-arrival gaps drawn from a gamma
distribution with shape ``burstiness`` and mean ``1 / rate``, so burstiness 1 is a Poisson
process, below 1 is burstier and above 1 is more regular; an infinite rate sends everything
at once.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def check_rate(rate: float) -> float:
    if not rate > 0:  # also rejects NaN
        raise ValueError(f"request rate must be > 0 (or inf), got {rate}")
    return rate


def synthetic_offsets(n: int, rate: float, burstiness: float = 1.0, seed: int = 0) -> list[float]:
    """Offsets of ``n`` arrivals at ``rate`` requests/s; the first arrives after one gap."""
    check_rate(rate)
    if not burstiness > 0:
        raise ValueError(f"burstiness must be > 0, got {burstiness}")
    if math.isinf(rate):
        return [0.0] * n
    rng = np.random.default_rng(seed)
    gaps = rng.gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=n)
    return np.cumsum(gaps).tolist()


def trace_offsets(timestamps: Sequence[float | None], time_scale: float = 1.0) -> list[float]:
    """The trace's own arrival times, in the given order, rebased to the earliest and
    multiplied by ``time_scale`` (0.5 replays the trace twice as fast)."""
    if not time_scale > 0:
        raise ValueError(f"trace time scale must be > 0, got {time_scale}")
    if not timestamps:
        return []
    if any(t is None for t in timestamps):
        raise ValueError("this dataset has no arrival timestamps; use --request-rate instead")
    start = min(timestamps)
    return [(t - start) * time_scale for t in timestamps]
