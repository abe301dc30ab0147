import dataclasses
import json
import os

import numpy as np
import pytest

from services.predictor import mlp
from services.predictor.config import EmbedderConfig, MLPConfig, PredictorConfig, StoreConfig
from services.predictor.core import Predictor
from services.predictor.embedder import META_FILE, STOCK_ENCODER_ID, Embedder, encoder_id
from services.predictor.finetune import fine_tune_encoder
from services.predictor.proxy import ProxyConfig
from services.predictor.store import LengthStore

TOPICS = ["the French revolution", "photosynthesis", "black holes", "the stock market",
          "volcanoes", "the Roman empire", "machine learning", "coral reefs", "jazz music",
          "the immune system", "electric cars", "medieval castles", "climate change",
          "honey bees", "the printing press", "quantum computing"]


def two_kinds():
    """Prompts on the same topics whose replies differ 50x in length by their instruction."""
    long = [f"Write a detailed essay about {t}." for t in TOPICS]
    short = [f"In one word, is {t} interesting?" for t in TOPICS]
    return long, short


def cross_similarity(embedder: Embedder, a: list[str], b: list[str]) -> float:
    """Mean cosine similarity of each prompt in a to the prompt of b on the same topic."""
    va, vb = embedder.encode(a), embedder.encode(b)
    return float(np.mean(np.sum(va * vb, axis=1)))


@pytest.fixture(scope="module")
def tuned_dir(tmp_path_factory):
    long, short = two_kinds()
    prompts = (long + short) * 2
    lengths = ([600] * len(long) + [3] * len(short)) * 2
    out = str(tmp_path_factory.mktemp("enc") / "encoder")
    enc_id = fine_tune_encoder(prompts, lengths, out, ProxyConfig(
        max_seq_length=16, epochs=3, batch_size=8, lr=1e-4))
    return out, enc_id


def test_fine_tuned_encoder_is_a_tagged_sentence_transformers_dir(tuned_dir):
    out, enc_id = tuned_dir
    with open(os.path.join(out, META_FILE)) as f:
        meta = json.load(f)
    assert meta["id"] == enc_id and meta["base"] == STOCK_ENCODER_ID and meta["num_records"] == 64
    assert encoder_id(out) == enc_id != STOCK_ENCODER_ID
    emb = Embedder(EmbedderConfig(out, max_seq_length=16, precision="fp32"))
    assert emb.encoder_id == enc_id and emb.dim == 384
    v = emb.encode(["hello there", "Write a detailed essay about volcanoes."])
    np.testing.assert_allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)
    assert not os.path.exists(out + ".tmp") and not os.path.exists(out + ".old")


def test_fine_tuning_separates_prompts_by_reply_length(tuned_dir):
    """Same topic, different verbosity: the stock encoder finds them close; the length-aware
    one must move them apart, so retrieval stops borrowing lengths across the two kinds."""
    long, short = two_kinds()
    stock = Embedder(EmbedderConfig(max_seq_length=16, precision="fp32"))
    tuned = Embedder(EmbedderConfig(tuned_dir[0], max_seq_length=16, precision="fp32"))
    before, after = cross_similarity(stock, long, short), cross_similarity(tuned, long, short)
    assert after < before - 0.1, (before, after)
    # Within a kind, prompts stay together.
    assert cross_similarity(tuned, long, long[1:] + long[:1]) > after


def test_fine_tune_refuses_too_little_or_mismatched_data(tmp_path):
    with pytest.raises(ValueError, match="too few"):
        fine_tune_encoder(["a b c"] * 4, [3] * 4, str(tmp_path / "e"))
    with pytest.raises(ValueError, match="lengths"):
        fine_tune_encoder(["a b c"] * 40, [3] * 39, str(tmp_path / "e"))
    assert not os.path.exists(tmp_path / "e")


def test_missing_encoder_directory_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="not a directory"):
        Embedder(EmbedderConfig(str(tmp_path / "nope")))


def test_store_refuses_a_collection_built_with_another_encoder():
    vecs = np.eye(4, dtype=np.float32)
    a = LengthStore(StoreConfig(), dim=4, encoder="enc-a")
    a.upsert("m", vecs, np.array([1, 2, 3, 4], np.float32), now=1.0)
    b = LengthStore(StoreConfig(), dim=4, client=a.client, encoder="enc-b")
    with pytest.raises(ValueError, match="encoder 'enc-a'"):
        b.search("m", vecs[:1], k=2)
    same = LengthStore(StoreConfig(), dim=4, client=a.client, encoder="enc-a")
    assert same.search("m", vecs[:1], k=1)[0].lengths.tolist() == [1.0]
    a.close()


def test_untagged_points_count_as_the_stock_encoder():
    from qdrant_client import models

    legacy = LengthStore(StoreConfig(), dim=4)
    name = legacy._collection("m", create=True)
    legacy.client.upsert(name, points=[models.PointStruct(
        id=1, vector=[1.0, 0, 0, 0], payload={"model": "m", "length": 5.0})])
    assert LengthStore(StoreConfig(), dim=4, client=legacy.client).has_model("m")
    with pytest.raises(ValueError, match="built with encoder"):
        LengthStore(StoreConfig(), dim=4, client=legacy.client, encoder="tuned").has_model("m")
    legacy.close()


def test_mlp_file_refuses_another_encoder(tmp_path):
    rng = np.random.default_rng(0)
    module = mlp.train(rng.normal(size=(64, 8)).astype(np.float32),
                       rng.integers(1, 100, 64).astype(np.float32),
                       MLPConfig(epochs=2, min_train_records=8, ensemble=1))
    path = str(tmp_path / "m.npz")
    mlp.save(module, path, 64, encoder="enc-a")
    assert mlp.load(path, 8, encoder="enc-a")[1] == 64
    with pytest.raises(ValueError, match="encoder 'enc-a'"):
        mlp.load(path, 8, encoder="enc-b")


def test_predictor_serves_from_the_tuned_encoder(tuned_dir):
    """The Predictor tags its DB with the tuned encoder and predicts through it; prompts the
    DB has not seen get the length of their own kind."""
    long, short = two_kinds()
    config = PredictorConfig(embedder=EmbedderConfig(tuned_dir[0], precision="fp32"),
                             mlp=MLPConfig(epochs=60, min_train_records=8), retrain_every=0)
    p = Predictor(config)
    assert p.store.encoder == tuned_dir[1] and p.embedder.max_seq_length == 16
    p.seed("m", long[:-2] + short[:-2], [600] * 14 + [3] * 14)
    preds = p.predict([long[-1], short[-1]], model="m")
    assert [x.source.value for x in preds] == ["retrieval", "retrieval"]
    assert preds[0].length > 10 * preds[1].length, preds
    p.store.close()


def test_a_new_fine_tune_in_the_same_directory_is_loaded_fresh(tmp_path):
    long, short = two_kinds()
    out = str(tmp_path / "encoder")
    cfg = ProxyConfig(max_seq_length=16, epochs=1, batch_size=8, num_layers=2)
    first = fine_tune_encoder(long + short, [600] * 16 + [3] * 16, out, cfg)
    v1 = Embedder(EmbedderConfig(out, precision="fp32")).encode(long[:2])
    second = fine_tune_encoder(long + short, [3] * 16 + [600] * 16, out,
                               dataclasses.replace(cfg, seed=1))
    emb = Embedder(EmbedderConfig(out, precision="fp32"))
    assert emb.encoder_id == second != first
    assert not np.allclose(emb.encode(long[:2]), v1)
