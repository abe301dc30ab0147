import numpy as np
import pytest

from services.predictor import mlp
from services.predictor.config import MLPConfig


def _data(n, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 16)).astype(np.float32)
    # Heavy-tailed lengths whose log depends on one direction, plus noise and outliers.
    log_len = 4.0 + 1.0 * x[:, 0] + rng.normal(scale=0.3, size=n)
    log_len[rng.random(n) < 0.05] += 3.0
    return x, np.expm1(log_len).round().clip(1)


def test_early_stopped_median_regressor_beats_a_constant(tmp_path):
    x, y = _data(600)
    cfg = MLPConfig(hidden=32, epochs=100, min_val_records=20)
    module = mlp.train(x[:500], y[:500], cfg)
    pred = mlp.MLPWeights(module, 1, 500).predict(x[500:])
    real = y[500:]
    rel = np.median(np.abs(pred - real) / real)
    const = np.median(np.abs(np.median(y[:500]) - real) / real)
    assert rel < 0.6 * const
    assert 0.3 < np.mean(pred < real) < 0.7  # a median fit: outliers do not drag it upward
    path = str(tmp_path / "w.npz")
    mlp.save(module, path, 500)
    loaded, n = mlp.load(path)
    assert n == 500
    np.testing.assert_allclose(mlp.MLPWeights(loaded, 2, n).predict(x[500:]), pred, rtol=1e-5)


def test_training_stops_within_an_epoch_of_being_asked(monkeypatch):
    import threading

    from services.predictor.learning import TrainingStopped

    x, y = _data(200)
    stop, epochs = threading.Event(), []
    real_epoch = mlp._epoch

    def counted(*args):
        epochs.append(1)
        if len(epochs) == 3:
            stop.set()
        return real_epoch(*args)
    monkeypatch.setattr(mlp, "_epoch", counted)
    with pytest.raises(TrainingStopped):
        mlp.train(x, y, MLPConfig(hidden=8, epochs=50, patience=50), stop=stop)
    assert len(epochs) == 3


def test_ensemble_saves_with_format_and_old_files_are_refused(tmp_path):
    x, y = _data(200)
    module = mlp.train(x, y, MLPConfig(hidden=8, epochs=3, ensemble=2))
    assert len(module.members) == 2 and module.input_dim == 16
    path = str(tmp_path / "w.npz")
    mlp.save(module, path, 200)
    with pytest.raises(ValueError, match="retrain"):
        mlp.load(path, input_dim=32)  # another embedder config: refused, not mis-read
    # A pre-ensemble (format 1) file: one Sequential's arrays, no format marker.
    old = str(tmp_path / "old.npz")
    arrays = {k: v.detach().numpy() for k, v in mlp.build_module(16, 8).state_dict().items()}
    np.savez(old, __num_records__=np.array(200), **arrays)
    with pytest.raises(ValueError, match="format 1"):
        mlp.load(old)
    with pytest.raises(ValueError, match="16-d inputs"):
        mlp.MLPWeights(module, 1, 200).predict(np.zeros((2, 32), np.float32))
