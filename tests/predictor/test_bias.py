import numpy as np
import pytest

from services.predictor.bias import BiasBook, weighted_quantile
from services.predictor.config import BiasConfig


def _noisy(rng, n, shift, outliers=0.1):
    """Residuals around `shift` with a fraction of absurd ones (failed or runaway replies)."""
    r = shift + rng.normal(scale=0.7, size=n)
    bad = rng.random(n) < outliers
    r[bad] = rng.choice([-8.0, 8.0], size=bad.sum())
    return r


def test_weighted_quantile():
    v = np.array([3.0, 1.0, 2.0])
    assert weighted_quantile(v, np.ones(3), 0.5) == 2.0
    assert weighted_quantile(v, np.array([1.0, 10.0, 1.0]), 0.5) == 1.0
    assert weighted_quantile(v, np.ones(3), 1.0) == 3.0


def test_shift_converges_within_100_observations_despite_outliers():
    rng = np.random.default_rng(0)
    book = BiasBook(BiasConfig())
    assert book.shift("m", "mlp") == 0.0  # nothing observed: no correction
    for r in _noisy(rng, 100, -1.6):
        book.add("m", "mlp", [r])
    assert book.shift("m", "mlp") == pytest.approx(-1.6, abs=0.25)


def test_a_few_residuals_move_the_estimate_only_part_way():
    book = BiasBook(BiasConfig(prior_weight=8))
    book.add("m", "mlp", [-2.0, -2.0])
    assert book.shift("m", "mlp") == 0.0
    book.add("m", "mlp", [-2.0] * 20)
    assert book.shift("m", "mlp") == -2.0


def test_shift_follows_drift():
    rng = np.random.default_rng(1)
    book = BiasBook(BiasConfig(half_life=100, window=400))
    book.add("m", "mlp", _noisy(rng, 400, -1.5))
    assert book.shift("m", "mlp") == pytest.approx(-1.5, abs=0.2)
    # The served model turns verbose: a step change is followed within a few dozen replies.
    book.add("m", "mlp", _noisy(rng, 50, 0.7))
    assert book.shift("m", "mlp") == pytest.approx(0.7, abs=0.3)
    # A slow drift too, through the recency weights.
    for step in np.linspace(0.7, 1.2, 10):
        book.add("m", "mlp", _noisy(rng, 30, step))
    assert book.shift("m", "mlp") == pytest.approx(1.2, abs=0.3)


def test_a_source_borrows_the_pooled_shift_until_it_has_its_own():
    book = BiasBook(BiasConfig(prior_weight=8))
    book.add("m", "mlp", [-1.0] * 50)
    assert book.shift("m", "retrieval") == book.shift("m") == -1.0
    book.add("m", "retrieval", [0.5] * 50)
    assert book.shift("m", "retrieval") == 0.5 and book.shift("other", "mlp") == 0.0


def test_a_flood_of_one_key_counts_once():
    book = BiasBook(BiasConfig())
    book.add("m", "mlp", np.zeros(60), keys=[f"p{i}" for i in range(60)])
    book.add("m", "mlp", np.full(5000, 4.0), keys=["same prompt"] * 5000)
    assert book.count("m", "mlp") == 61
    assert book.shift("m", "mlp") == 0.0


def test_residuals_are_read_with_the_current_offsets():
    """A residual measured against a prediction the seed shift moved by coef × shift is
    stored without it: refining the shift later does not count the old error twice."""
    book = BiasBook(BiasConfig(prior_weight=0.0))
    book.add("m", "mlp", [1.0] * 30, coefs=[(1.0,)] * 30)
    assert book.shift("m", "mlp", (0.0,)) == 1.0
    assert book.shift("m", "mlp", (1.0,)) == 0.0
    assert book.shift("m", "mlp", (0.4,)) == pytest.approx(0.6)


def test_upper_quantile_needs_enough_samples_and_covers():
    rng = np.random.default_rng(2)
    book = BiasBook(BiasConfig(min_samples=20))
    book.add("m", "mlp", rng.normal(size=10))
    assert book.quantile("m", "mlp", 0.9) is None
    r = rng.normal(size=300)
    book.add("m", "mlp", r)
    q = book.quantile("m", "mlp", 0.9)
    assert 0.8 < np.mean(r <= q) < 0.97
