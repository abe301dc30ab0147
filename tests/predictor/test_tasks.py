import logging
import os

import numpy as np
import pytest

from services.predictor import tasks
from services.predictor.core import Predictor
from services.predictor.types import Completion
from tests.predictor.conftest import small_config

BROKER = os.environ.get("LENSERVE_TEST_REDIS", "redis://127.0.0.1:6379/15")


def _redis_up() -> bool:
    try:
        import redis

        return redis.Redis.from_url(BROKER, socket_timeout=1).ping()
    except Exception:  # noqa: BLE001
        return False


@pytest.fixture(scope="module")
def worker():
    if not _redis_up():
        pytest.skip(f"Redis not reachable at {BROKER}")
    from celery.contrib.testing.worker import start_worker

    app = tasks.configure(BROKER, queue="lenserve-test-predictor")
    root_level = logging.getLogger().level   # the in-process worker sets the root logger's level
    try:
        with start_worker(app, pool="solo", perform_ping_check=False,
                          queues=["lenserve-test-predictor"], shutdown_timeout=10):
            yield app
    finally:
        logging.getLogger().setLevel(root_level)


def test_retrain_task_swaps_served_weights(worker, embedder, tmp_path):
    predictor = Predictor(small_config(similarity_threshold=1.01), embedder=embedder)
    retrainer = tasks.CeleryRetrainer(predictor, workdir=str(tmp_path),
                                      queue="lenserve-test-predictor", timeout_s=120)
    predictor.retrain_hook = retrainer
    short = [f"Give a one-word answer: what colour is item {i}?" for i in range(12)]
    long = [f"Write a detailed multi-page essay about the history of topic {i}." for i in range(12)]
    recs = [Completion("m", p, 5, f"s{i}") for i, p in enumerate(short)]
    recs += [Completion("m", p, 600, f"l{i}") for i, p in enumerate(long)]
    assert predictor.observe(recs).accepted == 24
    assert predictor.mlps.version("m") == 0
    thread = retrainer("m")
    thread.join(timeout=120)
    assert predictor.mlps.version("m") == 1
    preds = predictor.predict(["Give a one-word answer: what colour is the sky?",
                               "Write a detailed multi-page essay about the Roman empire."], "m")
    assert [p.source.value for p in preds] == ["mlp", "mlp"]
    assert 5 * preds[0].length < preds[1].length
    predictor.store.close()


def test_retrain_refuses_too_little_data(embedder, tmp_path):
    predictor = Predictor(small_config(), embedder=embedder)
    predictor.observe([Completion("m", "hello there", 3)])
    with pytest.raises(ValueError, match="too few"):
        tasks.CeleryRetrainer(predictor, workdir=str(tmp_path))("m")
    assert not np.any([predictor.mlps.version("m")])


def test_a_refit_under_celery_runs_in_the_service_process(monkeypatch, tmp_path):
    """The encoder is the service's own: a due refit runs in a thread here, not as a task;
    with nothing to refit from, the MLP retrain that was due is submitted instead."""
    from services.predictor import refit

    calls, submitted = [], []
    predictor = type("P", (), {"take_refit": lambda self: True})()
    retrainer = tasks.CeleryRetrainer(predictor, workdir=str(tmp_path))
    monkeypatch.setattr(retrainer, "_submit", lambda model: submitted.append(model) or (
        None, None))
    monkeypatch.setattr(retrainer, "_await", lambda *a: retrainer._done(a[0]))
    monkeypatch.setattr(refit, "refit_encoder", lambda p, stop=None: calls.append(p) or "new")
    retrainer("m").join(10)
    assert calls == [predictor] and submitted == [] and not retrainer._busy

    monkeypatch.setattr(refit, "refit_encoder", lambda p, stop=None: None)
    asked = [True]
    predictor.take_refit = lambda: bool(asked) and asked.pop()  # due once
    retrainer("m").join(10)
    assert submitted == ["m"] and not asked
