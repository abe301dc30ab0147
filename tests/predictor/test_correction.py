"""The predictor's correction through `Predictor.observe`, on a synthetic embedding space.

Prompts "t{topic} n{item}" embed near their topic's centre (similar prompts share a topic)
and the served model's length depends on the topic. The seed data set answers 4× longer. No
encoder is loaded: each test builds a predictor in a second or two.
"""
import hashlib

import numpy as np
import pytest

from services.predictor.config import MLPConfig
from services.predictor.core import Predictor
from services.predictor.types import Completion
from tests.predictor.conftest import small_config

DIM, TOPICS, VERBOSITY = 32, 8, 4
CENTRES = np.random.default_rng(0).normal(size=(TOPICS, DIM))
CENTRES /= np.linalg.norm(CENTRES, axis=1, keepdims=True)
BASE = 20 * (1 + np.arange(TOPICS))  # the served model's typical length per topic


class TopicEmbedder:
    """A prompt's vector: its topic's centre plus a fixed per-prompt direction."""

    dim = DIM
    encoder_id = "topics"

    def encode(self, prompts: list[str], cache: bool = False) -> np.ndarray:
        return np.stack([self._one(p) for p in prompts]).astype(np.float32)

    @staticmethod
    def _one(prompt: str) -> np.ndarray:
        topic = int(prompt.split()[0][1:])
        seed = int.from_bytes(hashlib.blake2b(prompt.encode(), digest_size=8).digest(), "big")
        u = np.random.default_rng(seed).normal(size=DIM)
        v = CENTRES[topic] + 0.6 * u / np.linalg.norm(u)
        return v / np.linalg.norm(v)


def _prompts(start: int, n: int) -> tuple[list[str], np.ndarray]:
    """n prompts cycling over the topics, and the served model's lengths for them."""
    rng = np.random.default_rng(start)
    topics = np.arange(start, start + n) % TOPICS
    lengths = np.round(BASE[topics] * np.exp(rng.normal(scale=0.2, size=n))).astype(int)
    return [f"t{t} n{start + i}" for i, t in enumerate(topics)], lengths


def _completions(prompts, lengths, tag: str) -> list[Completion]:
    return [Completion("m", p, int(n), f"{tag}{i}", finished_at=float(i + 1))
            for i, (p, n) in enumerate(zip(prompts, lengths))]


def _observe(predictor: Predictor, recs: list[Completion], batch: int = 32) -> None:
    for i in range(0, len(recs), batch):
        assert predictor.observe(recs[i:i + batch]).accepted == len(recs[i:i + batch])


@pytest.fixture
def seeded():
    config = small_config(retrain_every=1000, retrain_first=50,
                          mlp=MLPConfig(hidden=64, epochs=30, min_train_records=8, ensemble=1))
    predictor = Predictor(config, embedder=TopicEmbedder())
    prompts, served = _prompts(0, 160)
    predictor.seed("m", prompts, served * VERBOSITY)
    predictor.retrain("m")
    yield predictor
    predictor.store.close()


TEST_PROMPTS, TEST_REAL = _prompts(10_000, 80)


def _ratios(predictor: Predictor) -> tuple[np.ndarray, np.ndarray]:
    preds = predictor.predict(TEST_PROMPTS, "m")
    return (np.array([p.length for p in preds]) / TEST_REAL,
            np.array([p.upper_quantile for p in preds]) / TEST_REAL)


def test_observed_lengths_pull_predictions_to_the_served_scale(seeded):
    cold, _ = _ratios(seeded)
    assert np.median(cold) > 3.0  # predicted at the seed data's scale
    _observe(seeded, _completions(*_prompts(1000, 120), "r"))
    point, upper = _ratios(seeded)
    assert 0.75 < np.median(point) < 1.33
    assert np.median(np.abs(point - 1)) < 0.3
    # The padding moved too: it covers most replies without being 4× too loose.
    assert np.mean(upper >= 1) >= 0.75 and np.median(upper) < 2.0
    state = seeded.learning_state("m")
    assert state["seed_shift"]["retrieval"] == pytest.approx(-np.log(VERBOSITY), abs=0.35)


def test_the_correction_follows_a_model_that_turns_verbose(seeded):
    _observe(seeded, _completions(*_prompts(1000, 120), "r"))
    prompts, lengths = _prompts(2000, 160)
    _observe(seeded, _completions(prompts, lengths * 3, "v"))  # a new, 3× longer model
    point, _ = _ratios(seeded)
    assert 2.2 < np.median(point) < 4.0


def test_absurd_and_redelivered_completions_change_nothing(seeded):
    recs = _completions(*_prompts(1000, 64), "r")
    _observe(seeded, recs)
    before, state = _ratios(seeded)[0], seeded.learning_state("m")
    residuals = seeded.residuals.count("m")
    bad = [Completion("m", "t1 n5", n, f"bad{n}") for n in (0, -1, 10**6)]
    result = seeded.observe(bad + recs[:32])  # absurd lengths and a redelivered batch
    assert (result.accepted, result.rejected) == (0, 35)
    after = seeded.learning_state("m")
    assert after["stats"]["rejected_length"] == 3 and after["stats"]["duplicate"] == 32
    assert after["observed"] == state["observed"]
    assert seeded.residuals.count("m") == residuals
    np.testing.assert_array_equal(_ratios(seeded)[0], before)


def test_a_flood_of_one_prompt_counts_as_one_completion(seeded):
    _observe(seeded, _completions(*_prompts(1000, 64), "r"))
    before, observed = _ratios(seeded)[0], seeded.num_observed("m")
    residuals = seeded.residuals.count("m")
    flood = [Completion("m", "t3 n77777", 5000, f"f{i}") for i in range(600)]
    _observe(seeded, flood, batch=200)
    assert seeded.num_observed("m") == observed + 1
    assert seeded.residuals.count("m") == residuals + 1
    assert seeded.learning_state("m")["stats"]["merged"] == 599
    # Other prompts' predictions barely move.
    assert np.median(np.abs(np.log(_ratios(seeded)[0] / before))) < 0.1
