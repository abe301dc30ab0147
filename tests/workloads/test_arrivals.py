"""Arrival processes: vLLM's gamma/Poisson arrivals and trace replay."""
from __future__ import annotations

import math

import numpy as np
import pytest

from lenserve.workloads.arrivals import synthetic_offsets, trace_offsets


def test_infinite_rate_sends_everything_at_once():
    assert synthetic_offsets(5, math.inf) == [0.0] * 5


def test_poisson_mean_gap_is_one_over_rate():
    gaps = np.diff([0.0] + synthetic_offsets(20000, rate=4.0, seed=1))
    assert gaps.mean() == pytest.approx(0.25, rel=0.03)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.05)   # exponential: CV 1


@pytest.mark.parametrize("burstiness", [0.25, 4.0])
def test_burstiness_keeps_the_rate_and_sets_the_spread(burstiness):
    gaps = np.diff([0.0] + synthetic_offsets(20000, rate=2.0, burstiness=burstiness, seed=2))
    assert gaps.mean() == pytest.approx(0.5, rel=0.05)
    # Gamma with shape k has coefficient of variation 1/sqrt(k).
    assert gaps.std() / gaps.mean() == pytest.approx(1 / math.sqrt(burstiness), rel=0.08)


def test_same_seed_same_arrivals_and_increasing():
    a = synthetic_offsets(50, 3.0, seed=7)
    assert a == synthetic_offsets(50, 3.0, seed=7)
    assert a != synthetic_offsets(50, 3.0, seed=8)
    assert a == sorted(a) and a[0] > 0


@pytest.mark.parametrize("rate", [0.0, -1.0, math.nan])
def test_bad_rate_is_refused(rate):
    with pytest.raises(ValueError, match="request rate must be > 0"):
        synthetic_offsets(3, rate)


def test_bad_burstiness_is_refused():
    with pytest.raises(ValueError, match="burstiness must be > 0"):
        synthetic_offsets(3, 1.0, burstiness=0)


def test_trace_offsets_rebase_and_scale():
    assert trace_offsets([100.0, 101.0, 104.0], time_scale=0.5) == [0.0, 0.5, 2.0]


def test_trace_offsets_need_timestamps_and_a_positive_scale():
    with pytest.raises(ValueError, match="no arrival timestamps"):
        trace_offsets([1.0, None])
    with pytest.raises(ValueError, match="time scale must be > 0"):
        trace_offsets([1.0], time_scale=0)
