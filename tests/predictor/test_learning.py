import itertools

import numpy as np
import pytest

from services.predictor import learning
from services.predictor.config import PredictorConfig
from services.predictor.retrieval import retrieval_log
from services.predictor.learning import TrainedAt, retrain_due
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
