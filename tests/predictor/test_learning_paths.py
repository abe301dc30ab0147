"""The predictor learns the model it serves, the same way through every path.

Seeded from verbose replies (4× the served model's), it observes the served model's own
completions of other prompts, in-process, over gRPC or from Kafka, and must then predict
held-out prompts at the served model's scale.
"""
import asyncio
import json
import threading
import time

import numpy as np
import pytest

from services.predictor.config import MLPConfig
from services.predictor.core import Predictor
from services.predictor.types import Completion
from tests.predictor.conftest import small_config

ALPACA = "/work/shared/data/alpaca_data_1k_random_subset.json"
VERBOSITY = 4  # the seed data set's replies are this much longer than the served model's
SEED, OBSERVE, TEST = slice(0, 200), slice(200, 392), slice(400, 480)
BATCH = 32


def _alpaca():
    with open(ALPACA) as f:
        rows = json.load(f)[:480]
    prompts = [r["instruction"] + ("\n\n" + r["input"] if r["input"] else "") for r in rows]
    return prompts, np.array([max(2, len(r["output"].split())) for r in rows])


PROMPTS, SERVED = _alpaca()


def _seeded(embedder) -> Predictor:
    config = small_config(retrain_every=1000, retrain_first=50,
                          mlp=MLPConfig(epochs=40, min_train_records=8, ensemble=1))
    predictor = Predictor(config, embedder=embedder)
    predictor.seed("m", PROMPTS[SEED], SERVED[SEED] * VERBOSITY)
    predictor.retrain("m")
    return predictor


def _stream() -> list[list[Completion]]:
    recs = [Completion("m", p, int(n), f"r{i}", finished_at=float(i + 1))
            for i, (p, n) in enumerate(zip(PROMPTS[OBSERVE], SERVED[OBSERVE]))]
    return [recs[i:i + BATCH] for i in range(0, len(recs), BATCH)]


def _ratio_and_error(predictor: Predictor) -> tuple[float, float]:
    pred = np.array([p.length for p in predictor.predict(PROMPTS[TEST], "m")])
    real = SERVED[TEST]
    return float(np.median(pred / real)), float(np.median(np.abs(pred - real) / real))


@pytest.fixture(scope="module")
def learnt_in_process(embedder):
    predictor = _seeded(embedder)
    cold = _ratio_and_error(predictor)
    for batch in _stream():
        assert predictor.observe(batch).accepted == len(batch)
    yield predictor, cold
    predictor.store.close()


def test_observing_a_terser_model_moves_predictions_to_its_scale(learnt_in_process):
    predictor, (ratio_before, err_before) = learnt_in_process
    ratio_after, err_after = _ratio_and_error(predictor)
    assert ratio_before > 2.5
    assert 0.7 < ratio_after < 1.45
    assert err_after < 0.5 * err_before
    state = predictor.learning_state("m")
    assert state["seed_shift"]["mlp"] == pytest.approx(-np.log(VERBOSITY), abs=0.45)
    # Every completion is an observed point, but for a rare near-duplicate merged into one.
    assert len(PROMPTS[OBSERVE]) - 5 <= state["observed"] <= len(PROMPTS[OBSERVE])
    # Retrained by observed count: at 50, then doubling once the one on probation was judged;
    # a retrained MLP is served only if it ranked the completions after it as well.
    retrains, served = state["stats"]["retrains"], state["stats"].get("retrains_served", 0)
    assert retrains >= 2 and served + state["stats"].get("retrains_dropped", 0) >= 1
    assert state["mlp_version"] == 1 + served
    if served:
        assert state["mlp_seed_share"] < 0.5


def test_retraining_weights_observed_records_and_moves_seed_targets(learnt_in_process):
    predictor, _ = learnt_in_process
    data = predictor.training_set("m")
    assert data.num_observed == predictor.num_observed("m")
    assert len(data.vectors) == predictor.store.count("m")
    assert data.weights[data.observed].sum() / data.weights.sum() == pytest.approx(
        1 - data.seed_share)
    assert data.weights[data.observed][0] > data.weights[~data.observed][0]
    # Seed targets are moved to the served model's scale, observed ones kept as they were.
    seed_targets = np.sort(data.lengths[~data.observed])
    np.testing.assert_allclose(np.median(seed_targets), np.median(SERVED[SEED]), rtol=0.5)
    np.testing.assert_allclose(np.median(data.lengths[data.observed]),
                               np.median(SERVED[OBSERVE]), rtol=0.1)


def test_upper_quantile_follows_the_served_model(learnt_in_process):
    predictor, _ = learnt_in_process
    preds = predictor.predict(PROMPTS[TEST], "m")
    covered = np.mean([real <= p.upper_quantile for p, real in zip(preds, SERVED[TEST])])
    assert covered >= 0.75
    # Padding at the served model's scale, not the seed's: the bound is not 4× too loose.
    assert np.median([p.upper_quantile / real for p, real in zip(preds, SERVED[TEST])]) < 4


def _observe_over_grpc(predictor: Predictor) -> None:
    from services.predictor.client import AsyncPredictorClient
    from services.predictor.servicer import build_server, mark_serving

    async def run():
        server, port = build_server(predictor, "127.0.0.1:0")
        await server.start()
        await mark_serving(server)
        client = AsyncPredictorClient(f"127.0.0.1:{port}", timeout_s=60)
        try:
            for batch in _stream():
                assert (await client.observe(batch)).accepted == len(batch)
        finally:
            await client.close()
            await server.stop(grace=1)
    asyncio.run(run())


def _observe_over_kafka(predictor: Predictor, bootstrap: str) -> None:
    from services.predictor.kafka_bus import CompletionConsumer, CompletionProducer, ensure_topic

    topic = "completions-learning"
    ensure_topic(bootstrap, topic)
    producer = CompletionProducer(bootstrap, topic=topic)
    for batch in _stream():
        for rec in batch:
            producer.send(rec)
    producer.flush()
    producer.close()
    consumer = CompletionConsumer(bootstrap, predictor.observe, topic=topic,
                                  group_id="learning-test", max_records=BATCH)
    stop = threading.Event()
    thread = threading.Thread(target=consumer.run, args=(stop,), daemon=True)
    thread.start()
    deadline = time.monotonic() + 120
    while consumer.applied < len(PROMPTS[OBSERVE]) and time.monotonic() < deadline:
        time.sleep(0.2)
    stop.set()
    thread.join(timeout=30)
    consumer.close()
    assert consumer.applied == len(PROMPTS[OBSERVE])


@pytest.mark.parametrize("path", ["grpc", "kafka"])
def test_the_same_learning_through_every_path(path, learnt_in_process, embedder, request):
    reference, _ = learnt_in_process
    predictor = _seeded(embedder)
    try:
        if path == "grpc":
            _observe_over_grpc(predictor)
        else:
            _observe_over_kafka(predictor, request.getfixturevalue("kafka_bootstrap"))
        mine, theirs = predictor.learning_state("m"), reference.learning_state("m")
        assert mine["observed"] == theirs["observed"]
        assert mine["seed_shift"]["mlp"] == pytest.approx(theirs["seed_shift"]["mlp"], abs=0.1)
        assert mine["stats"]["retrains"] >= 2 and theirs["stats"]["retrains"] >= 2
        ratio, _ = _ratio_and_error(predictor)
        assert 0.7 < ratio < 1.45
    finally:
        predictor.store.close()


def test_bad_completions_have_bounded_influence_and_are_counted(embedder):
    predictor = _seeded(embedder)
    batches = _stream()
    for batch in batches[:3]:
        predictor.observe(batch)
    before = predictor.learning_state("m")
    preds_before = np.array([p.length for p in predictor.predict(PROMPTS[TEST], "m")])
    # A flood of one prompt with a runaway length, absurd lengths, a redelivered batch.
    flood = [Completion("m", "Repeat after me: hello.", 3000, f"f{i}") for i in range(2000)]
    for i in range(0, len(flood), 250):
        assert predictor.observe(flood[i:i + 250]).accepted == 250
    absurd = [Completion("m", PROMPTS[0], n, f"a{n}") for n in (0, -5, 40_000)]
    result = predictor.observe(absurd + batches[0])
    assert (result.accepted, result.rejected) == (0, len(absurd) + len(batches[0]))
    after = predictor.learning_state("m")
    stats = after["stats"]
    assert stats["rejected_length"] == 3 and stats["duplicate"] == len(batches[0])
    assert stats["merged"] >= len(flood) - 1
    assert after["observed"] == before["observed"] + 1  # the flood is one point
    assert after["stats"]["retrains"] == before["stats"]["retrains"]
    assert after["seed_shift"]["mlp"] == pytest.approx(before["seed_shift"]["mlp"], abs=0.1)
    preds_after = np.array([p.length for p in predictor.predict(PROMPTS[TEST], "m")])
    assert np.median(np.abs(np.log(preds_after / preds_before))) < 0.1
    predictor.store.close()
