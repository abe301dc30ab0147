import itertools

import numpy as np
import pytest

from services.predictor import learning
from services.predictor.config import PredictorConfig
from services.predictor.learning import TrainedAt, retrain_due
from services.predictor.retrieval import retrieval_log, retrieval_weight, seed_retrieval_log
from services.predictor.store import Neighbours


def test_seed_weight_falls_as_observations_accumulate():
    w = [learning.seed_weight(n, 100) for n in (0, 10, 100, 1000, 10_000)]
    assert w[0] == 1.0 and w[2] == 0.5 and all(a > b for a, b in itertools.pairwise(w))
    assert learning.seed_weight(500, 0) == 1.0


def test_training_weights_give_observed_records_their_share():
    observed = np.array([True] * 500 + [False] * 8000)
    w = learning.training_weights(observed, parity=100)
    assert w.mean() == pytest.approx(1.0)
    assert w[observed].sum() / w.sum() == pytest.approx(learning.observed_share(500, 100))
    assert w[observed][0] > 50 * w[~observed][0]  # 500 replies outweigh 8,000 seed records
    np.testing.assert_array_equal(learning.training_weights(observed[:500], 100), 1.0)


def test_retrieval_prefers_observed_neighbours_and_moves_seed_ones():
    nb = Neighbours(np.array([0.95, 0.9]), np.array([400.0, 40.0]), np.array([False, True]))
    even, share = retrieval_log(nb, 0.7, 0.0, 1.0)
    assert share == pytest.approx(0.95 / 1.85)
    down, share_down = retrieval_log(nb, 0.7, 0.0, 0.1)
    assert np.expm1(down) < 60 < np.expm1(even) and share_down < 0.1
    # The seed shift moves the seed neighbour's length, never the observed one's.
    moved, _ = retrieval_log(nb, 0.7, -np.log(10.0), 1.0)
    assert np.expm1(moved) == pytest.approx(40.0, rel=0.05)


def test_retrain_schedule_by_observed_count():
    config = PredictorConfig(retrain_first=50, retrain_every=1000)
    due = lambda n, at: retrain_due(config, n, TrainedAt(at, 0.0), 0.0)
    assert due(49, 0) is None and due(50, 0)
    assert due(99, 50) is None and due(100, 50)  # doubling while few were observed
    assert due(1599, 800) is None and due(1600, 800)
    assert due(5999, 5000) is None and due(6000, 5000)  # then every retrain_every
    assert retrain_due(PredictorConfig(retrain_every=0), 10_000, TrainedAt(), 5.0) is None


def test_retrain_when_the_seed_shift_moved():
    config = PredictorConfig(retrain_first=50, retrain_shift=0.25, retrain_min_new=20)
    last = TrainedAt(200, -1.0)
    assert retrain_due(config, 230, last, -1.1) is None  # moved too little
    assert "shift" in retrain_due(config, 230, last, -1.4)
    assert retrain_due(config, 210, last, -1.4) is None  # too few new completions yet


def test_training_set_moves_seed_targets_only_and_reports_their_share():
    observed = np.array([False] * 6 + [True] * 2)
    lengths = np.array([400, 400, 800, 800, 100, 100, 90, 110], np.float32)
    data = learning.training_set(np.zeros((8, 4), np.float32), lengths, observed,
                                 seed_shift=-np.log(4.0), parity=2)
    seed_moved = np.expm1(np.log1p(lengths[~observed]) - np.log(4.0))
    np.testing.assert_allclose(data.lengths[~observed], seed_moved, rtol=1e-5)
    np.testing.assert_allclose(data.lengths[observed], lengths[observed], rtol=1e-6)
    assert data.num_observed == 2
    # Two observed at parity 2: half of the weight is theirs, half the seed records'.
    assert data.seed_share == pytest.approx(0.5)
    assert data.weights[observed][0] == pytest.approx(3 * data.weights[~observed][0])


def test_observed_share_rises_towards_one():
    shares = [learning.observed_share(n, 100) for n in (0, 50, 100, 500, 5000)]
    assert shares[0] == 0.0 and shares[2] == 0.5 and shares[-1] < 1.0
    assert all(a < b for a, b in itertools.pairwise(shares))
    assert learning.observed_share(500, 100) == pytest.approx(5 / 6)


def test_a_retrain_follows_the_seed_shift_in_either_direction():
    config = PredictorConfig(retrain_shift=0.25, retrain_min_new=20)
    last = TrainedAt(300, 0.5)
    assert retrain_due(config, 330, last, 0.2)  # moved down by 0.3
    assert retrain_due(config, 330, last, 0.8)  # moved up by 0.3
    assert retrain_due(config, 330, last, 0.74) is None


def test_retrieval_ignores_neighbours_below_the_floor():
    nb = Neighbours(np.array([0.9, 0.5]), np.array([10.0, 1000.0]), np.array([True, True]))
    log_len, share = retrieval_log(nb, 0.7, 0.0, 1.0)
    assert np.expm1(log_len) == pytest.approx(10.0) and share == 0.0
    assert np.isnan(seed_retrieval_log(nb, 0.7))  # no seed neighbour to measure against
    seeded = Neighbours(np.array([0.9, 0.8]), np.array([10.0, 1000.0]), np.array([True, False]))
    assert np.expm1(seed_retrieval_log(seeded, 0.7)) == pytest.approx(1000.0)


def test_retrieval_weight_ramps_between_s0_minus_width_and_s0():
    assert retrieval_weight(0.85, 0.8, 0.1) == 1.0
    assert retrieval_weight(0.75, 0.8, 0.1) == pytest.approx(0.5)
    assert retrieval_weight(0.65, 0.8, 0.1) == 0.0
    assert (retrieval_weight(0.8, 0.8, 0.0), retrieval_weight(0.79, 0.8, 0.0)) == (1.0, 0.0)
