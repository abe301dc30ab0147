"""The embedded predictor in the serving loop, and completions sent to Kafka."""
from __future__ import annotations

import gzip
import json
import threading
import time

import pytest

from lenserve_contract.sampling_params import SamplingParams
from services.predictor.kafka_bus import CompletionConsumer, ensure_topic
from services.predictor.config import StoreConfig
from services.predictor.core import Predictor
from services.predictor.local import BUNDLED_SEED, load_seed, make_predictor
from services.scheduler.wiring import EngineConfig, engine_parts
from services.scheduler.engine_core import EngineCore

PROMPTS = ["Write a haiku about rain.", "Explain quantum computing in detail, with examples.",
           "Say hi.", "List ten facts about Mars."]


SEED_TOPICS = ["sourdough loaf", "cheesecake", "lasagna", "pizza"]


def seed_file(tmp_path, n=40):
    path = tmp_path / "seed.jsonl.gz"
    with gzip.open(path, "wt") as f:
        for i in range(n):
            # Unlike the served prompts, so that what is learnt from them is not averaged away.
            f.write(json.dumps({"prompt": f"Recipe {i}: how long to bake a {SEED_TOPICS[i % 4]}?",
                                "output_len": 100 + i}) + "\n")
    return path


def run(engine: EngineCore, prompts=PROMPTS, max_tokens=5):
    for i, p in enumerate(prompts):
        engine.add_request(str(i), prompt=p, sampling_params=SamplingParams(
            max_tokens=max_tokens, ignore_eos=True, temperature=0))
    outs = {}
    deadline = time.monotonic() + 60
    while engine.has_unfinished_requests() and time.monotonic() < deadline:
        outs.update({o.request_id: o for o in engine.step() if o.finished})
    return outs


def served_predictor(engine: EngineCore):
    """The engine's embedded predictor, once PROMPTS (5 tokens each) were served, predicted
    and observed."""
    assert len(run(engine)) == 4
    pump = engine.predictions
    assert pump.flush(60) and pump.num_predicted == 4
    return pump.predictor


def test_bundled_seed_loads():
    prompts, lengths = load_seed(BUNDLED_SEED)
    assert len(prompts) == len(lengths) == 2000 and min(lengths) >= 0


def test_a_bad_seed_file_is_refused_with_its_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a", "output_len": 3}\n{"text": "b"}\n')
    with pytest.raises(ValueError, match="bad.jsonl:2"):
        load_seed(bad)


def test_embedded_predictions_and_learning_from_completions(tmp_path):
    cfg = EngineConfig(model="fake", predictor="embedded", predictor_seed=str(seed_file(tmp_path)),
                       max_model_len=64, check_integrity=True)
    engine = EngineCore(**engine_parts(cfg))
    try:
        core = served_predictor(engine).core
        vectors, lengths, *_ = core.export("fake")
        assert len(lengths) >= 8 + 4   # seeded, then one point per served prompt
        # The completions taught the DB: each prompt now retrieves its own served length.
        preds = core.predict(PROMPTS, "fake")
        assert [p.length for p in preds] == [5, 5, 5, 5]
    finally:
        engine.close()


def built_db(tmp_path, model="fake", n=40):
    """A DB as ``lenserve predictor build --qdrant-path DIR`` leaves it (no MLP file: the
    engine trains one on the copy)."""
    from tests.predictor.conftest import small_config

    db = str(tmp_path / "db")
    core = Predictor(small_config(store=StoreConfig(qdrant_path=db)))
    prompts, lengths = zip(*[(f"Recipe {i}: how long to bake a {SEED_TOPICS[i % 4]}?", 100 + i)
                             for i in range(n)])
    core.seed(model, list(prompts), list(lengths))
    count = core.store.count(model)
    core.store.close()
    return db, count


def test_an_engine_starts_from_a_built_db_learns_in_a_copy_and_leaves_the_db_as_it_was(
        tmp_path):
    db, count = built_db(tmp_path)
    cfg = EngineConfig(model="fake", predictor=f"embedded:{db}", max_model_len=64)
    engine = EngineCore(**engine_parts(cfg))
    try:
        predictor = served_predictor(engine)
        workdir = predictor._workdir
        core = predictor.core
        assert core.store.count("fake") == count + 4    # learnt the served prompts...
        assert [p.length for p in core.predict(PROMPTS, "fake")] == [5, 5, 5, 5]
    finally:
        engine.close()
    # ...in a private copy, removed on close: the built DB is as it was, so a second engine
    # does not know the served lengths.
    import os
    assert not os.path.exists(workdir)
    again = make_predictor(f"embedded:{db}", "fake")
    try:
        assert again.core.store.count("fake") == count
        assert all(p.length >= 100 for p in again.core.predict(PROMPTS, "fake"))
    finally:
        again.close()


def test_an_embedded_predictor_retrains_beside_its_predictions_at_the_lowest_priority(
        tmp_path, monkeypatch):
    """A retrain takes seconds to tens of seconds on a CPU: it must not hold up the
    predictions queued behind the observe call that triggered it."""
    import os
    from services.predictor.interface import PredictQuery

    db, _ = built_db(tmp_path, n=12)
    predictor = make_predictor(f"embedded:{db}", "fake")
    core, started, release, seen = predictor.core, threading.Event(), threading.Event(), {}

    def slow_retrain(model, stop=None):
        seen["nice"] = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
        started.set()
        release.wait(30)
        return 1
    monkeypatch.setattr(core, "retrain", slow_retrain)
    try:
        thread = core.retrain_hook("fake")
        assert started.wait(10)
        preds = predictor.predict([PredictQuery(p, 64) for p in PROMPTS], "fake")
        assert len(preds) == 4 and all(p.length > 0 for p in preds)
        assert not release.is_set() and thread.is_alive()   # answered while it trains
        assert core.retrain_hook("fake") is None             # one retrain at a time
        release.set()
        thread.join(10)
        assert seen["nice"] == 19
    finally:
        release.set()
        predictor.close()


def test_closing_an_embedded_predictor_stops_its_retrain(tmp_path):
    # A process that exits while a thread is inside torch aborts (exit status 134).
    db, _ = built_db(tmp_path)
    predictor = make_predictor(f"embedded:{db}", "fake")
    thread = predictor.core.retrain_hook("fake")
    predictor.close()
    assert not thread.is_alive()
    assert predictor.core.retrain_hook("fake") is None      # none starts after close


def test_a_missing_db_or_one_of_another_model_is_a_clear_error(tmp_path, monkeypatch):
    import tempfile

    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    with pytest.raises(ValueError, match="no predictor DB at .*lenserve predictor build"):
        make_predictor(f"embedded:{tmp_path / 'nothing'}", "fake")
    db, _ = built_db(tmp_path, model="other", n=8)
    with pytest.raises(ValueError, match="holds other model.*not 'fake'.*--model fake"):
        make_predictor(f"embedded:{db}", "fake")
    assert not list(scratch.iterdir())      # the refused copy is not left behind
    with pytest.raises(ValueError, match="embedded:DIR starts from the DB"):
        make_predictor(f"embedded:{db}", "other", seed_path=str(seed_file(tmp_path)))


def test_completions_go_to_kafka_when_a_bootstrap_server_is_set(tmp_path, kafka_bootstrap,
                                                               predictor):
    ensure_topic(kafka_bootstrap, "completions")
    cfg = EngineConfig(model="fake", predictor="embedded", predictor_seed=str(seed_file(tmp_path)),
                       kafka_bootstrap=kafka_bootstrap, max_model_len=64)
    engine = EngineCore(**engine_parts(cfg))
    try:
        assert len(run(engine, max_tokens=7)) == 4
        assert engine.predictions.flush(30)
    finally:
        engine.close()
    consumer = CompletionConsumer(kafka_bootstrap, predictor.observe, group_id="loop-test")
    stop = threading.Event()
    thread = threading.Thread(target=consumer.run, args=(stop,), daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while consumer.applied < 4 and time.monotonic() < deadline:
        time.sleep(0.1)
    stop.set()
    thread.join(timeout=10)
    consumer.close()
    assert consumer.applied == 4
    assert [p.length for p in predictor.predict(PROMPTS, model="fake")] == [7, 7, 7, 7]
