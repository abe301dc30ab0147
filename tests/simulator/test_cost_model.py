import math

import pytest

from services.simulator.cost_model import LinearCostModel, fit_linear
from services.simulator.features import from_groups
from services.simulator.profiler import KNOTS, SMALL_BATCH, grid

TRUE = LinearCostModel(0.004, (2e-5, 1e-4, 3e-8, 2e-7, 1e-5, -4e-6), knots=(128, 512))


def test_fit_recovers_a_piecewise_linear_model_exactly():
    batches = grid(max_tokens=2048, kv_tokens=16384, max_len=2048, large=False)
    features = [from_groups(list(b)) for b in batches]
    seconds = [TRUE.iteration_s(f) for f in features]
    model, report = fit_linear(features, seconds, knots=(128, 512))
    assert report.max_abs_rel_error < 1e-9
    assert model.intercept_s == pytest.approx(TRUE.intercept_s, rel=1e-6)
    for got, want in zip(model.coefficients, TRUE.coefficients):
        assert got == pytest.approx(want, rel=1e-5, abs=1e-12)


def test_features_count_causal_pairs_and_context():
    f = from_groups([(1, 4, 0), (2, 1, 9)])
    assert (f.tokens, f.sampled, f.num_seqs, f.context) == (6, 3, 3, 24)
    assert f.attended == 10 + 2 * 10     # 4*5/2 for the prompt, 10 keys per decode


def test_fit_refuses_empty_or_nonpositive_points():
    with pytest.raises(ValueError):
        fit_linear([], [])
    with pytest.raises(ValueError):
        fit_linear([from_groups([(1, 1, 0)])], [0.0])


def test_model_never_predicts_a_negative_time():
    model = LinearCostModel(-1.0, (0.0, 0.0, 0.0))
    assert model.iteration_s(from_groups([(1, 1, 0)])) > 0
    assert not math.isnan(model.iteration_s(from_groups([(1, 1, 0)])))


def test_the_profiler_grid_and_knots_follow_a_jagged_small_batch_curve():
    # Measured on a CPU: three decodes cost more than four, five to seven more than eight.
    jagged = {1: 0.035, 2: 0.063, 3: 0.081, 4: 0.071, 5: 0.086, 6: 0.087, 7: 0.096, 8: 0.086}

    def seconds(f):
        smooth = 0.004 + 2e-4 * f.tokens + 5e-8 * f.attended + 1e-7 * f.context
        return smooth + jagged.get(f.tokens, 0.09)

    batches = grid(max_tokens=2048, kv_tokens=16384, max_len=2048, large=False)
    assert {b[0][0] for b in batches if b[0][1] == 1} >= set(range(1, SMALL_BATCH + 1))
    features = [from_groups(list(b)) for b in batches]
    model, _ = fit_linear(features, [seconds(f) for f in features], KNOTS)
    for d in range(1, 9):
        f = from_groups([(d, 1, 100)])
        assert model.iteration_s(f) == pytest.approx(seconds(f), rel=0.03), d
