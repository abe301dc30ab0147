"""Predictions in the serving loop: they reach the policy (late ones too), never block an
iteration, and a failing or unreachable predictor costs only default predictions."""
from __future__ import annotations

import threading
import time

from engine_helpers import make_engine, run_to_completion

from lenserve_contract.sampling_params import SamplingParams
from services.predictor.interface import LengthPredictor
from services.predictor.local import GrpcPredictor, OraclePredictor
from services.predictor.types import Prediction, Source
from services.scheduler.engine_core import EngineCore
from services.scheduler.policies.vllm import VllmPolicy
from services.scheduler.predictions import PredictionPump


class RecordingPolicy(VllmPolicy):
    name = "test-recording"

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.seen: list[tuple[str, int, str]] = []
        self.timings = []

    def on_prediction(self, request, prediction):
        self.seen.append((request.request_id, prediction.length, prediction.source))

    def update(self, output, updated, result=None):
        self.timings.append(result.timings if result is not None else None)


def engine_with(predictor: LengthPredictor, **kw) -> EngineCore:
    engine = make_engine(**kw)
    engine.predictions = PredictionPump(predictor, "fake")
    engine.scheduler.policy = RecordingPolicy(engine.scheduler.config)
    return engine


def add(engine, n=4, max_tokens=6, traced=False):
    """``traced``: each reply's true length (3 + i) is given, for the oracle; it also ends
    the request there. Otherwise every request runs to ``max_tokens``."""
    for i in range(n):
        engine.add_request(str(i), prompt=f"prompt {i}", true_output_len=3 + i if traced else None,
                           sampling_params=SamplingParams(max_tokens=max_tokens, ignore_eos=True,
                                                          temperature=0))


def test_oracle_predictions_reach_the_policy_before_the_first_schedule():
    engine = engine_with(OraclePredictor())
    add(engine, traced=True)
    engine.step()
    assert sorted(engine.scheduler.policy.seen) == [(str(i), 3 + i, "oracle") for i in range(4)]
    outs = run_to_completion(engine)
    assert all(o.metrics.predicted_output_len == 3 + int(r) for r, o in outs.items())
    assert all(o.metrics.prediction_source == "oracle" for o in outs.values())
    assert all(t is not None for t in engine.scheduler.policy.timings)


class SlowPredictor(LengthPredictor):
    name = "slow"

    def __init__(self):
        self.release = threading.Event()
        self.observed = []

    def predict(self, queries, model):
        self.release.wait(10)
        return [Prediction(42, Source.MLP, 0.5, 50) for _ in queries]

    def observe(self, completions):
        self.observed.extend(completions)


def test_a_slow_predictor_never_blocks_an_iteration_and_late_predictions_still_arrive():
    predictor = SlowPredictor()
    engine = engine_with(predictor)
    add(engine, n=2, max_tokens=30)
    start = time.monotonic()
    for _ in range(5):
        engine.step()
    assert time.monotonic() - start < 2.0          # served while the predictor hangs
    assert engine.scheduler.policy.seen == []
    predictor.release.set()
    assert engine.predictions.flush(10)
    engine.step()
    assert sorted(engine.scheduler.policy.seen) == [("0", 42, "mlp"), ("1", 42, "mlp")]
    run_to_completion(engine)
    assert engine.predictions.flush(10)
    got = sorted((c.request_id, c.num_output_tokens, c.predicted_length, c.prompt)
                 for c in predictor.observed)
    assert got == [("0", 30, 42, "prompt 0"), ("1", 30, 42, "prompt 1")]


class BrokenPredictor(SlowPredictor):
    def predict(self, queries, model):
        raise RuntimeError("boom")

    def observe(self, completions):
        raise RuntimeError("boom too")


def test_a_raising_predictor_loses_no_request():
    engine = engine_with(BrokenPredictor())
    add(engine)
    outs = run_to_completion(engine)
    assert len(outs) == 4 and all(o.outputs[0].finish_reason == "length" for o in outs.values())
    assert engine.predictions.flush(10)
    assert engine.predictions.num_dropped_completions == 4


def test_an_unreachable_predictor_service_gives_default_predictions(caplog):
    caplog.set_level("WARNING", logger="services.scheduler.predictions")
    engine = engine_with(GrpcPredictor("127.0.0.1:1", timeout_s=0.5))
    add(engine, n=2)
    assert engine.predictions.flush(20)
    outs = run_to_completion(engine)
    assert len(outs) == 2
    seen = engine.scheduler.policy.seen
    assert {s for _, _, s in seen} == {"default"} and len(seen) == 2
    # Their completion records cannot be reported: counted as dropped, and said once.
    assert engine.predictions.flush(20)
    add(engine, n=2)
    run_to_completion(engine)
    assert engine.predictions.flush(20)
    assert engine.predictions.num_dropped_completions == 4
    assert engine.stats().num_completions_dropped == 4
    assert sum("completion report failed" in r.message for r in caplog.records) == 1


def test_oracle_from_the_engine_config_and_no_prediction_for_given_lengths():
    engine = make_engine(predictor="oracle")
    engine.add_request("given", prompt="x", predicted_output_len=9,
                       sampling_params=SamplingParams(max_tokens=4))
    engine.add_request("asked", prompt="y", true_output_len=2,
                       sampling_params=SamplingParams(max_tokens=4))
    outs = run_to_completion(engine)
    assert outs["asked"].metrics.prediction_source == "oracle"
    assert outs["given"].metrics.prediction_source is None   # given at add_request, not asked


def test_noisy_oracle_errs_by_the_size_asked_and_the_same_way_every_run():
    import math
    import statistics

    import pytest

    from services.predictor.interface import PredictQuery
    from services.predictor.local import make_predictor

    queries = [PredictQuery(prompt="", max_tokens=4096, true_output_len=100 + i)
               for i in range(400)]
    exact = make_predictor("oracle:0", "fake").predict(queries, "fake")
    assert [p.length for p in exact] == [q.true_output_len for q in queries]
    noisy = make_predictor("oracle:0.6", "fake").predict(queries, "fake")
    again = make_predictor("oracle:0.6", "fake").predict(queries, "fake")
    assert [p.length for p in noisy] == [p.length for p in again]       # seeded
    other = make_predictor("oracle:0.6:1", "fake").predict(queries, "fake")
    assert [p.length for p in other] != [p.length for p in noisy]
    logs = [math.log(p.length / q.true_output_len) for p, q in zip(noisy, queries)]
    assert 0.5 < statistics.stdev(logs) < 0.7 and abs(statistics.mean(logs)) < 0.1
    # Its upper quantile is calibrated as a predictor's: the true length lies under it 9
    # times in 10; the exact oracle's is its (sure) length.
    covered = sum(q.true_output_len <= p.upper_quantile for p, q in zip(noisy, queries))
    assert 0.85 < covered / len(queries) < 0.95
    assert all(p.upper_quantile == p.length for p in exact)
    # Without a true length there is nothing to perturb: max_tokens, as the exact oracle.
    [blind] = make_predictor("oracle:0.6", "fake").predict(
        [PredictQuery(prompt="", max_tokens=7)], "fake")
    assert blind.length == 7
    for bad in ("oracle:-1", "oracle:nan", "oracle:x", "oracle:0.5:y"):
        with pytest.raises(ValueError, match="oracle:SIGMA"):
            make_predictor(bad, "fake")


def test_a_policy_ranks_by_the_noisy_oracle_from_the_engine_config():
    engine = make_engine(predictor="oracle:1.0", policy="alise")
    for i in range(8):
        engine.add_request(str(i), prompt="p", true_output_len=20,
                           sampling_params=SamplingParams(max_tokens=20, ignore_eos=True))
    outs = run_to_completion(engine)
    predicted = {o.metrics.predicted_output_len for o in outs.values()}
    assert len(predicted) > 1 and predicted != {20}         # errors, not the true length
    assert all(o.metrics.prediction_source == "oracle" for o in outs.values())
    assert all(len(o.outputs[0].token_ids) == 20 for o in outs.values())
