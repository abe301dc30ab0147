"""The seed neighbour's weight learnt from finished requests (seed_weight.py)."""
import numpy as np
import pytest

from services.predictor import learning
from services.predictor.seed_weight import GRID, SeedWeightFit
from services.predictor.store import Neighbours


def _completions(fit: SeedWeightFit, n: int, seed_noise: float, observed_noise: float,
                 seed_scale: float = 1.0, rng_seed: int = 0) -> None:
    """n finished requests, each with 4 seed and 4 observed neighbours whose log lengths are
    the truth plus noise (the seed's also times ``seed_scale``)."""
    rng = np.random.default_rng(rng_seed)
    for _ in range(n):
        truth = rng.uniform(2, 7)
        seed = np.expm1(truth + rng.normal(0, seed_noise, 4)) * seed_scale
        obs = np.expm1(truth + rng.normal(0, observed_noise, 4))
        fit.add(Neighbours(np.full(8, 0.8), np.concatenate([seed, obs]),
                           np.array([False] * 4 + [True] * 4)), float(truth))


def test_a_seed_as_good_as_the_served_models_own_replies_keeps_full_weight():
    fit = SeedWeightFit(window=512, min_records=50)
    _completions(fit, 200, seed_noise=0.3, observed_noise=0.9)
    assert fit.refit(0.0, force=True) == 1.0


def test_a_seed_that_says_little_of_the_served_model_is_weighted_down():
    fit = SeedWeightFit(window=512, min_records=50)
    _completions(fit, 200, seed_noise=3.0, observed_noise=0.3)
    assert fit.refit(0.0, force=True) <= 0.05


def test_the_seed_shift_is_applied_before_the_fit():
    """Seed replies half as long as the served model's: once retrieval's shift (log 2) moves
    them, they are as good as the observed ones; unmoved, they look worse."""
    moved, unmoved = SeedWeightFit(512, 50), SeedWeightFit(512, 50)
    for fit in (moved, unmoved):
        _completions(fit, 200, seed_noise=0.2, observed_noise=0.6, seed_scale=0.5)
    assert moved.refit(np.log(2.0), force=True) == 1.0
    assert unmoved.refit(0.0, force=True) < 1.0


def test_nothing_is_learnt_from_completions_the_weight_does_not_change():
    fit = SeedWeightFit(window=512, min_records=3, refit_every=1)
    seeds_only = Neighbours(np.full(3, 0.9), np.array([10.0, 20, 30]), np.zeros(3, bool))
    observed_only = Neighbours(np.full(3, 0.9), np.array([10.0, 20, 30]), np.ones(3, bool))
    for nb in (seeds_only, observed_only) * 5:
        assert not fit.add(nb, 3.0)
    assert len(fit) == 0 and fit.refit(0.0) is None


def test_the_weight_waits_for_enough_completions_and_is_refitted_in_steps():
    fit = SeedWeightFit(window=512, min_records=50, refit_every=16)
    _completions(fit, 49, seed_noise=3.0, observed_noise=0.3)
    assert fit.refit(0.0) is None
    _completions(fit, 1, seed_noise=3.0, observed_noise=0.3, rng_seed=1)
    first = fit.refit(0.0)
    assert first is not None and first in GRID
    # The window slides: once the seed is as good as the observed replies, the weight rises.
    _completions(fit, 600, seed_noise=0.3, observed_noise=0.9, rng_seed=2)
    assert fit.refit(0.0) == 1.0 > first


def test_a_learnt_seed_weight_weights_the_mlps_records_the_same_way():
    observed = np.array([True] * 10 + [False] * 90)
    w = learning.training_weights(observed, parity=25, seed_w=0.25)
    assert w.mean() == pytest.approx(1.0)
    assert w[0] / w[-1] == pytest.approx(4.0)
    # Without one, the observed_parity curve: 10 observed get 10/35 of the weight.
    curve = learning.training_weights(observed, parity=25)
    assert curve[observed].sum() / curve.sum() == pytest.approx(10 / 35)
