"""Refitting the encoder to the served model's replies (services/predictor/refit.py)."""
import dataclasses
import logging
import os
import threading
from types import SimpleNamespace

import numpy as np
import pytest

from services.predictor import refit
from services.predictor.config import EmbedderConfig, PredictorConfig, StoreConfig
from services.predictor.core import Predictor
from services.predictor.learning import TrainingStopped
from services.predictor.store import StoredRecords
from services.predictor.types import Completion
from tests.predictor.test_finetune import cross_similarity, two_kinds


def _config(tmp_path, **kw) -> PredictorConfig:
    base = dict(embedder=EmbedderConfig(max_seq_length=16, precision="fp32"),
                store=StoreConfig(qdrant_path=":memory:"), default_model="m",
                refit_first=64, refit_epochs=3, refit_dir=str(tmp_path / "refit"),
                retrain_first=1000, retrain_every=1000)
    return PredictorConfig(**{**base, **kw})


def _seeded(config) -> Predictor:
    """Seeded by a model whose reply length does not depend on the instruction."""
    long, short = two_kinds()
    p = Predictor(config)
    p.seed("m", long + short, [100] * (len(long) + len(short)))
    return p


def _served() -> list[Completion]:
    """The served model: essays and reports get 600 tokens, one-word answers 3 (64 replies,
    half of them to the seed's prompts)."""
    long, short = two_kinds()
    topics = [p.removeprefix("In one word, is ").removesuffix(" interesting?") for p in short]
    prompts = long + short + [f"Compose a long, thorough report on {t}." for t in topics] \
        + [f"Answer yes or no: is {t} boring?" for t in topics]
    lengths = [600 if "essay" in p or "report" in p else 3 for p in prompts]
    return [Completion("m", p, n, f"r{i}", finished_at=float(i + 1))
            for i, (p, n) in enumerate(zip(prompts, lengths))]


def test_due_at_the_first_count_then_each_doubling():
    cfg = SimpleNamespace(refit_first=250, refit_epochs=2)
    assert not refit.due(cfg, 249, 0) and refit.due(cfg, 250, 0)
    assert not refit.due(cfg, 499, 250) and refit.due(cfg, 500, 250)
    assert not refit.due(SimpleNamespace(refit_first=0, refit_epochs=2), 10_000, 0)
    assert not refit.due(SimpleNamespace(refit_first=250, refit_epochs=0), 10_000, 0)


def test_training_pairs_centre_each_model_and_keep_the_most_recent():
    def rec(lengths, observed, seen, tag):
        n = len(lengths)
        return StoredRecords([f"{tag}{i}" for i in range(n)], [f"{tag}{i}" for i in range(n)],
                             np.array(lengths, np.float32), np.array(observed, bool),
                             np.array(seen, float))
    terse = rec([10, 40, 999], [True, True, False], [1, 2, 3], "a")
    verbose = rec([1000, 4000], [True, True], [4, 5], "b")
    texts, lengths = refit.training_pairs({"a": terse, "b": verbose}, max_records=10)
    assert texts == ["a0", "a1", "b0", "b1"]  # seed points never train the encoder
    logs = np.log1p(lengths)
    # Each model's short and long replies land on the same two targets: scale is not taught.
    assert logs[0] == pytest.approx(logs[2], abs=0.05)
    assert logs[1] == pytest.approx(logs[3], abs=0.05)
    assert refit.training_pairs({"a": terse, "b": verbose}, max_records=2)[0] == ["b0", "b1"]


def test_refit_swaps_the_encoder_the_db_and_the_mlp_together(tmp_path, caplog):
    caplog.set_level(logging.INFO)
    p = _seeded(_config(tmp_path))
    long, short = two_kinds()
    before = p.embedder.encoder_id
    sim_before = cross_similarity(p.embedder, long, short)
    result = p.observe(_served())  # 64 observed: the refit is due, and runs inline
    assert result.accepted == 64 and p.stats["refits"] == 1
    assert "encoder refitted on 64 observed records" in caplog.text
    after = p.embedder.encoder_id
    assert after != before and p.store.encoder == after
    # The served model's distinction is now in the space: essays and one-word prompts on the
    # same topic moved apart.
    assert cross_similarity(p.embedder, long, short) < sim_before - 0.05
    # Every point was embedded again by the new encoder from the text it keeps.
    rec = p.store.records("m")
    assert len(rec.ids) == 64 and rec.observed.sum() == 64 == p.num_observed("m")
    texts = [rec.texts[i] for i in range(0, len(rec.ids), 7)]
    for nb in p.store.search("m", p.embedder.encode(texts), 1):
        assert nb.scores[0] == pytest.approx(1.0, abs=1e-4)  # each text finds its own point
    assert p.mlps.get("m").seed_share == 0.0  # trained on the new vectors: all observed
    # The new encoder is named for the next start; predictions read the new space.
    assert refit.current_refit(str(tmp_path / "refit")) == p.embedder.path
    preds = p.predict(long[:4] + short[:4])
    assert all(x.error is None for x in preds)
    assert min(x.length for x in preds[:4]) > max(x.length for x in preds[4:])
    p.close()


def test_the_next_refit_starts_from_the_base_encoder_and_drops_the_previous(tmp_path):
    from services.predictor.embedder import default_encoder_path

    p = _seeded(_config(tmp_path, refit_epochs=1))
    p.observe(_served())
    first = p.embedder.path
    assert refit.base_encoder(first) == default_encoder_path()
    assert refit.refit_encoder(p) == p.embedder.encoder_id
    assert p.embedder.path != first and not os.path.exists(first)
    from services.predictor import embedder as embedder_module
    assert not [k for k in embedder_module._MODELS if k[0] == first]  # nor held in memory
    assert refit.base_encoder(p.embedder.path) == default_encoder_path()  # not `first`
    assert refit.current_refit(str(tmp_path / "refit")) == p.embedder.path
    p.close()


def test_a_stopped_refit_leaves_everything_as_it_was(tmp_path):
    p = _seeded(_config(tmp_path, refit_first=0, refit_epochs=1))
    p.observe(_served())
    enc, vectors = p.embedder.encoder_id, p.export("m")[0]
    stop = threading.Event()
    stop.set()
    with pytest.raises(TrainingStopped):
        refit.refit_encoder(p, stop)
    assert p.embedder.encoder_id == enc == p.store.encoder
    np.testing.assert_array_equal(p.export("m")[0], vectors)
    assert not [d for d in os.listdir(tmp_path / "refit") if d.startswith(refit.PREFIX)]
    assert refit.current_refit(str(tmp_path / "refit")) is None
    assert all(x.error is None for x in p.predict(["Write a detailed essay about jazz."]))
    p.close()


def test_points_without_text_are_not_refitted_and_nothing_changes(tmp_path, caplog):
    caplog.set_level(logging.INFO)
    p = Predictor(_config(tmp_path))
    v = p.embedder.encode(["an old point"])
    p.store.upsert("m", v, np.array([5.0], np.float32), 0.0, observed=False)  # no text kept
    enc = p.embedder.encoder_id
    p.observe(_served())
    assert p.stats["refits"] == 1 and p.embedder.encoder_id == enc
    assert "1 DB points keep no text to embed again" in caplog.text
    assert p.mlps.get("m") is not None  # the MLP retrain that was due ran instead
    p.close()


def test_serve_restarts_on_the_refitted_encoder(tmp_path):
    from services.predictor.__main__ import config_from_args
    from tests.predictor.test_commands import _parse

    db = str(tmp_path / "db")
    args = _parse(["predictor", "serve", "--qdrant-path", db, "--model", "m",
                   "--precision", "fp32", "--max-seq-length", "16", "--refit-first", "64",
                   "--refit-epochs", "1"])
    config = dataclasses.replace(config_from_args(args), retrain_first=1000)
    assert config.refit_dir == db + "-encoder-refit"
    p = _seeded(config)
    p.observe(_served())
    refitted = p.embedder.encoder_id
    p.close()
    again = config_from_args(args)
    assert again.embedder.encoder_path == refit.current_refit(db + "-encoder-refit")
    q = Predictor(again)
    assert q.embedder.encoder_id == refitted
    assert q.store.has_model("m")  # its vectors are accepted: same encoder
    assert q.store.count("m", observed=True) == 64
    q.close()


def test_an_observation_raced_by_a_refit_is_stored_in_the_new_space(tmp_path):
    """Embedding runs outside the lock: if a refit swaps the encoder meanwhile, the vectors
    are made again by the new one before they are stored."""
    p = Predictor(_config(tmp_path, refit_first=0))
    old = p.embedder

    class Rolled:  # another space of the same width
        def encode(self, prompts, cache=False):
            return np.roll(old.encode(prompts), 5, axis=1)

    class Racing:
        def encode(self, prompts, cache=False):
            p.embedder = Rolled()  # the swap lands while this batch is being embedded
            return old.encode(prompts, cache)

    p.embedder = Racing()
    p.observe([Completion("m", "Write a detailed essay about jazz music.", 600, "a")])
    (nb,) = p.store.search("m", Rolled().encode(["Write a detailed essay about jazz music."]), 1)
    assert nb.scores[0] == pytest.approx(1.0, abs=1e-5)
    p.close()


def test_a_failed_refit_loses_no_observation(tmp_path, monkeypatch, caplog):
    def broken(predictor, stop=None):
        raise RuntimeError("disk full")
    monkeypatch.setattr(refit, "refit_encoder", broken)
    p = _seeded(_config(tmp_path))
    enc = p.embedder.encoder_id
    result = p.observe(_served())
    assert result.accepted == 64 and not result.errors
    assert p.stats["refits"] == 1 and p.embedder.encoder_id == enc
    assert "encoder refit failed: disk full" in caplog.text
    assert p.mlps.get("m").seed_share < 1.0  # the MLP retrain that was due ran instead
    assert p.store.count("m", observed=True) == 64
    p.close()


def test_with_a_qdrant_server_refits_need_a_lasting_directory(tmp_path, monkeypatch):
    from services.predictor.__main__ import config_from_args
    from tests.predictor.test_commands import _parse

    monkeypatch.delenv("LENSERVE_REFIT_DIR", raising=False)
    server = ["predictor", "serve", "--qdrant-url", "http://127.0.0.1:6333"]
    assert config_from_args(_parse(server)).refit_first == 0
    kept = config_from_args(_parse(server + ["--refit-dir", str(tmp_path)]))
    assert kept.refit_first == 250 and kept.refit_dir == str(tmp_path)
    assert config_from_args(_parse(["predictor", "serve"])).refit_first == 250  # :memory:


def test_served_the_refit_runs_in_the_retrain_thread(tmp_path):
    """As `serve` and the embedded predictor run it: observe returns at once, the refit
    lands from the retrain thread, and predictions go on during and after it."""
    from services.predictor.learning import ThreadRetrainer

    p = _seeded(_config(tmp_path, refit_epochs=1))
    p.retrain_hook = hook = ThreadRetrainer(p)
    before = p.embedder.encoder_id
    assert p.observe(_served()).accepted == 64
    thread = hook._busy.get("m")
    assert thread is not None  # running in the background, not on the observe call
    while thread.is_alive():
        assert all(x.error is None for x in p.predict(["Write a detailed essay about jazz."]))
        thread.join(0.2)
    assert p.embedder.encoder_id != before and p.store.encoder == p.embedder.encoder_id
    p.close()


def test_a_model_first_seen_during_a_refit_is_embedded_in_the_new_space(tmp_path, monkeypatch):
    p = _seeded(_config(tmp_path, refit_first=0, refit_epochs=1))
    p.observe(_served())
    train = refit._train
    prompt = "Name three primary colours."

    def train_while_another_model_arrives(predictor, model, *args):
        if not predictor.store.has_model("other"):
            predictor.observe([Completion("other", prompt, 9, "o1")])
        return train(predictor, model, *args)
    monkeypatch.setattr(refit, "_train", train_while_another_model_arrives)
    refit.refit_encoder(p)
    (nb,) = p.store.search("other", p.embedder.encode([prompt]), 1)
    assert nb.scores[0] == pytest.approx(1.0, abs=1e-4)
    assert p.store.has_model("other")  # tagged with the new encoder: accepted
    p.close()
