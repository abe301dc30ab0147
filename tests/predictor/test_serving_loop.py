"""The embedded predictor in the serving loop, and completions sent to Kafka."""
from __future__ import annotations

import gzip
import json
import threading
import time

import pytest

from lenserve_contract.sampling_params import SamplingParams
from services.predictor.kafka_bus import CompletionConsumer, ensure_topic
from services.predictor.local import BUNDLED_SEED, load_seed
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
        outs = run(engine)
        assert len(outs) == 4
        pump = engine.predictions
        assert pump.flush(60) and pump.num_predicted == 4
        core = pump.predictor.core
        vectors, lengths, *_ = core.export("fake")
        assert len(lengths) >= 8 + 4   # seeded, then one point per served prompt
        # The completions taught the DB: each prompt now retrieves its own served length.
        preds = core.predict(PROMPTS, "fake")
        assert [p.length for p in preds] == [5, 5, 5, 5]
    finally:
        engine.close()


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
