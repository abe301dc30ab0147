import numpy as np
import pytest

from services.predictor.bias import BiasBook, ResidualWindow, weighted_quantile
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


def _no_restart(**kw) -> BiasConfig:
    """Recency weights alone: the step-change detector is switched off."""
    return BiasConfig(change_threshold=1e9, **kw)


def test_recent_residuals_outweigh_older_ones():
    """A plain median of 300 old residuals at 0 and 150 new ones at 1 is 0; with a half-life
    of 100 the new ones carry most of the weight and the estimate is theirs."""
    book = BiasBook(_no_restart(half_life=100, window=1000, prior_weight=0.0))
    book.add("m", "mlp", np.zeros(300))
    book.add("m", "mlp", np.ones(150))
    assert book.shift("m", "mlp") == 1.0
    # Without recency (a half-life far beyond the window) the majority wins.
    flat = BiasBook(_no_restart(half_life=1e9, window=1000, prior_weight=0.0))
    flat.add("m", "mlp", np.zeros(300))
    flat.add("m", "mlp", np.ones(150))
    assert flat.shift("m", "mlp") == 0.0


def test_weights_halve_every_half_life_and_the_window_is_bounded():
    window = ResidualWindow(_no_restart(half_life=10, window=25))
    for r in range(40):
        window.add(float(r))
    res, w = window.arrays()
    np.testing.assert_array_equal(res, np.arange(15, 40))  # the latest 25 are kept
    assert w[-1] == 1.0 and w[-11] == pytest.approx(0.5) and w[-21] == pytest.approx(0.25)


def test_a_flood_of_one_key_does_not_age_the_others():
    window = ResidualWindow(_no_restart(half_life=10, window=100))
    for i in range(10):
        window.add(0.0, key=i)
    _, before = window.arrays()
    for _ in range(1000):
        window.add(5.0, key="flood")
    res, after = window.arrays()
    assert len(window) == 11 and res[-1] == 5.0
    np.testing.assert_allclose(after[:10], before[:10] * 0.5 ** 0.1)  # aged by one add only


def test_noise_and_outliers_do_not_restart_the_window_but_a_step_does():
    rng = np.random.default_rng(3)
    config = BiasConfig(min_samples=20, window=400)
    book = BiasBook(config)
    book.add("m", "mlp", _noisy(rng, 300, -1.0))
    assert book.count("m", "mlp") == 300  # a stationary stream keeps all its evidence
    book.add("m", "mlp", _noisy(rng, 20, 1.0, outliers=0.0))
    assert book.count("m", "mlp") == config.min_samples  # only the latest survive a step
    assert book.shift("m", "mlp") == pytest.approx(1.0, abs=0.4)


def test_the_prior_counts_as_prior_weight_residuals_and_fades():
    slow = BiasBook(BiasConfig(prior_weight=8, half_life=1e6, change_threshold=1e9))
    slow.add("m", "mlp", [-1.0] * 7)
    assert slow.shift("m", "mlp") == 0.0  # 7 residuals against 8 pseudo-residuals at 0
    slow.add("m", "mlp", [-1.0] * 2)
    assert slow.shift("m", "mlp") == -1.0
    # The prior is the oldest evidence: with a half-life of 10, 7 residuals already outweigh
    # it (8 × 0.5^0.7 ≈ 4.9 against their 5.7).
    fast = BiasBook(BiasConfig(prior_weight=8, half_life=10, change_threshold=1e9))
    fast.add("m", "mlp", [-1.0] * 6)
    assert fast.shift("m", "mlp") == 0.0
    fast.add("m", "mlp", [-1.0])
    assert fast.shift("m", "mlp") == -1.0


def test_an_estimate_is_recomputed_after_its_model_learns_and_kept_for_others():
    book = BiasBook(BiasConfig(prior_weight=0.0))
    book.add("a", "mlp", [1.0] * 30)
    book.add("b", "mlp", [-1.0] * 30)
    assert (book.shift("a", "mlp"), book.shift("b", "mlp")) == (1.0, -1.0)
    book.add("a", "mlp", [2.0] * 100)
    assert book.shift("a", "mlp") == 2.0 and book.shift("b", "mlp") == -1.0
    assert book.quantile("a", "mlp", 0.9) == 2.0
