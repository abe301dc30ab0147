import dataclasses
import itertools
import json

import numpy as np
import pytest

from services.predictor.core import Predictor
from services.predictor.types import Completion, Source
from tests.predictor.conftest import small_config

ALPACA = "/work/shared/data/alpaca_data_1k_random_subset.json"


def test_no_data_gives_safe_default(predictor):
    [p] = predictor.predict(["Tell me a joke."], model="fresh")
    assert p.source is Source.DEFAULT and p.error.code == "UNKNOWN_MODEL"
    assert p.length == predictor.config.default_length and p.upper_quantile >= p.length


def test_bad_prompts_get_default_and_others_still_predicted(predictor):
    predictor.observe([Completion("m", "Name three primary colours.", 12)])
    preds = predictor.predict(["", "   ", None, "Name three primary colours.", "x" * 500_000], "m")
    assert [p.source for p in preds[:3]] == [Source.DEFAULT] * 3
    assert all(p.error.code == "INVALID_ARGUMENT" for p in preds[:3])
    assert preds[3].source is Source.RETRIEVAL and preds[3].length == 12
    assert preds[4].length >= 1  # a huge prompt is truncated, not a crash


def test_allowlist_rejects_unknown_model(embedder):
    predictor = Predictor(small_config(models=("served",)), embedder=embedder)
    [p] = predictor.predict(["hi there"], model="other")
    assert p.source is Source.DEFAULT and p.error.code == "UNKNOWN_MODEL" and p.error.field
    result = predictor.observe([Completion("other", "hi there", 3, "r1"),
                                Completion("served", "hi there", 3, "r2")])
    assert (result.accepted, result.rejected) == (1, 1)
    assert "r1" in result.errors[0].message


def test_observe_rejects_bad_records_and_keeps_good_ones(predictor):
    result = predictor.observe([Completion("m", "", 5, "a"), Completion("m", "ok prompt", -1, "b"),
                                Completion("m", "ok prompt", 7, "c")])
    assert (result.accepted, result.rejected) == (1, 2)
    assert {e.code for e in result.errors} == {"INVALID_ARGUMENT"}
    assert predictor.store.count("m") == 1


def test_retrieval_is_similarity_weighted_mean(predictor):
    predictor.seed("m", ["Translate 'cat' into German.", "Translate 'dog' into German."], [4, 8])
    [p] = predictor.predict(["Translate 'cat' into German."], "m")
    assert p.source is Source.RETRIEVAL and p.top_similarity == pytest.approx(1.0, abs=1e-4)
    # The exact match carries the most weight, its sibling pulls the mean toward 8.
    assert 4 <= p.length <= 6


def test_low_similarity_falls_back_to_mlp(predictor):
    prompts = [f"Question number {i}: what is {i} plus {i}?" for i in range(20)]
    predictor.seed("m", prompts, [10] * 20)
    predictor.retrain("m")
    [p] = predictor.predict(["Compose a sonnet on the ocean at night."], "m")
    assert p.source is Source.MLP and p.top_similarity < predictor.config.similarity_threshold


def test_unreachable_qdrant_falls_back_not_crashes(predictor, embedder):
    from services.predictor.config import StoreConfig
    from services.predictor.store import LengthStore
    from tests.predictor.conftest import free_port

    predictor.seed("m", [f"Say hello number {i}" for i in range(10)], [5] * 10)
    predictor.retrain("m")
    down = LengthStore(StoreConfig(qdrant_url=f"http://127.0.0.1:{free_port()}"), embedder.dim)
    cut_off = Predictor(small_config(), embedder=embedder, store=down)
    [p] = cut_off.predict(["Say hello number 3"], "m")
    assert p.source is Source.DEFAULT and p.error.code == "UNAVAILABLE"
    cut_off.mlps = predictor.mlps  # with an MLP loaded, the answer degrades to the MLP
    [p] = cut_off.predict(["Say hello number 3"], "m")
    assert p.source is Source.MLP
    result = cut_off.observe([Completion("m", "Say hello", 5, "r")])
    assert result.rejected == 1 and result.errors[0].code == "UNAVAILABLE"


def test_calibrated_upper_quantile_covers_real_lengths(embedder):
    # MLP only, so that every residual lands in one calibration window.
    predictor = Predictor(small_config(similarity_threshold=2.0), embedder=embedder)
    rng = np.random.default_rng(0)
    prompts = [f"Describe item {i} in detail" for i in range(60)]
    lengths = rng.integers(50, 150, size=60)
    predictor.seed("m", prompts[:30], lengths[:30])
    predictor.retrain("m")
    predictor.calibrate("m", prompts[30:], lengths[30:])
    preds = predictor.predict(prompts[30:], "m")
    covered = np.mean([r <= p.upper_quantile for p, r in zip(preds, lengths[30:])])
    assert covered >= 0.8
    assert all(p.upper_quantile >= p.length for p in preds)


def _alpaca(n):
    with open(ALPACA) as f:
        rows = json.load(f)[:n]
    return [r["instruction"] + ("\n\n" + r["input"] if r["input"] else "") for r in rows], \
        [max(1, len(r["output"].split())) for r in rows]


def test_online_updates_track_a_terser_model(embedder):
    """The served model answers 3× shorter than the seed data; observing its own completions
    (repeat prompts and new ones) must cut the prediction error on held-out prompts."""
    prompts, lengths = _alpaca(150)
    lengths = np.array(lengths) * 3  # the seed data set is verbose
    predictor = Predictor(small_config(), embedder=embedder)
    predictor.seed("m", prompts[:100], lengths[:100])
    predictor.retrain("m")
    served = lengths // 3
    test_p, test_real = prompts[120:], served[120:]

    def errors() -> tuple[float, float]:
        pred = np.array([p.length for p in predictor.predict(test_p, "m")])
        real = np.maximum(test_real, 1)
        return float(np.median(pred / real)), float(np.median(np.abs(pred - real) / real))
    ratio_before, err_before = errors()
    predictor.observe([Completion("m", p, int(n), f"r{i}", finished_at=float(i + 1))
                       for i, (p, n) in enumerate(zip(prompts[:120], served[:120]))])
    predictor.retrain("m")
    ratio_after, err_after = errors()
    assert ratio_before > 2.0 and 0.67 < ratio_after < 1.5  # the 3× verbosity is learnt away
    assert err_after < 0.6 * err_before
    [p] = predictor.predict([prompts[0]], "m")
    assert p.length == served[0]  # the served model's own completion replaced the seed


def test_embedding_is_head_and_tail_concatenated():
    from services.predictor.config import EmbedderConfig
    from services.predictor.embedder import Embedder

    embedder = Embedder(EmbedderConfig(max_seq_length=64, tail_chars=300))
    head_only = Embedder(EmbedderConfig(max_seq_length=64, tail_chars=0))
    long_prompt = "word " * 400 + "Summarize the above in one line."
    v = embedder.encode(["Hi there", long_prompt])
    assert v.shape == (2, 2 * head_only.dim) == (2, embedder.dim)
    np.testing.assert_allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)
    # A short prompt is its own tail; a long one's tail differs from its head.
    h = head_only.encode(["Hi there", long_prompt])
    np.testing.assert_allclose(v[0, :head_only.dim] * np.sqrt(2), h[0], atol=1e-5)
    np.testing.assert_array_equal(v[0, :head_only.dim], v[0, head_only.dim:])
    assert float(v[1, :head_only.dim] @ v[1, head_only.dim:]) * 2 < 0.9


def test_blend_weight_is_monotonic_in_similarity():
    from services.predictor.retrieval import retrieval_weight

    sims = np.linspace(0.0, 1.0, 101)
    w = [retrieval_weight(s, 0.8, 0.1) for s in sims]
    assert all(a <= b for a, b in itertools.pairwise(w))
    assert w[69] == 0.0 and w[81] == 1.0 and 0.0 < w[75] < 1.0
    assert [retrieval_weight(s, 0.8, 0.0) for s in (0.79, 0.8)] == [0.0, 1.0]


def test_blended_prediction_lies_between_retrieval_and_mlp(predictor):
    from services.predictor.store import Neighbours

    nb = Neighbours(np.array([0.75], np.float32), np.array([400.0], np.float32),
                    np.array([True]))
    mlp_log = float(np.log1p(25.0))
    low = Neighbours(np.array([0.6], np.float32), nb.lengths, nb.observed)
    # Below s0 the MLP's answer is averaged with the wide neighbourhood's mean (weight 0.5).
    log_len, source, _, _, _ = predictor._combine(low, mlp_log, 1.0, 0.0, 1.0)
    assert log_len == pytest.approx((np.log1p(400) + mlp_log) / 2) and source is Source.MLP
    # ALISE's blend alone (wide_weight 0): s0 0.8, width 0.1, half and half at 0.75.
    predictor.config = dataclasses.replace(predictor.config, wide_weight=0.0)
    log_len, source, _, _, _ = predictor._combine(nb, mlp_log, 1.0, 0.0, 1.0)
    assert log_len == pytest.approx((np.log1p(400) + mlp_log) / 2)
    log_len, source, _, _, _ = predictor._combine(low, mlp_log, 1.0, 0.0, 1.0)
    assert log_len == mlp_log and source is Source.MLP
    # With no MLP yet, the hard switch at s0 still applies.
    assert predictor._combine(nb, None, 0.0, 0.0, 1.0)[1] is Source.DEFAULT


def test_db_of_another_vector_width_is_refused(tmp_path, embedder):
    from services.predictor.config import StoreConfig
    from services.predictor.store import LengthStore

    path = str(tmp_path / "db")
    old = LengthStore(StoreConfig(qdrant_path=path), dim=2 * embedder.dim)
    old.upsert("m", np.eye(2 * embedder.dim, dtype=np.float32)[:2], np.array([3.0, 4.0]), 0.0)
    old.close()
    store = LengthStore(StoreConfig(qdrant_path=path), dim=embedder.dim)
    with pytest.raises(ValueError, match="rebuild the DB"):
        store.count("m")
    store.close()


def test_encoder_precision_is_resolved_and_checked():
    from services.hardware import cpu_has_native_bf16
    from services.predictor.embedder import resolve_precision

    assert resolve_precision("auto") == ("bf16" if cpu_has_native_bf16() else "fp32")
    assert resolve_precision("int8") == "int8"
    with pytest.raises(ValueError, match="precision"):
        resolve_precision("fp16")


def test_a_prompt_gets_the_same_vector_alone_and_in_a_batch(embedder):
    prompt = "Write a haiku about the sea"
    alone = embedder.encode([prompt])[0]
    batched = embedder.encode(["x " * 40, prompt, "Hi"])[1]
    assert float(alone @ batched) > 0.999


def test_embedders_of_one_encoder_share_their_vector_cache():
    from services.predictor.config import EmbedderConfig
    from services.predictor.embedder import Embedder

    first = Embedder(EmbedderConfig(max_seq_length=64, tail_chars=0))
    second = Embedder(EmbedderConfig(max_seq_length=64, tail_chars=0))
    other = Embedder(EmbedderConfig(max_seq_length=32, tail_chars=0))   # another window
    prompt = "A prompt only this test embeds: the shared cache"
    v = first.encode([prompt], cache=True)
    assert second.cache is first.cache and other.cache is not first.cache
    [hit] = second.cache.get_many([second._key(prompt)])
    np.testing.assert_array_equal(hit, v[0])
    assert other.cache.get_many([other._key(prompt)]) == [None]
