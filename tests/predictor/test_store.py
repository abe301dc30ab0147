import numpy as np

from services.predictor.config import StoreConfig
from services.predictor.store import LengthStore, collection_name, merge_payload


def _unit(rng, n, dim=16):
    v = rng.normal(size=(n, dim)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def test_near_duplicates_merge_within_and_across_batches():
    store = LengthStore(StoreConfig(), dim=16)
    v = _unit(np.random.default_rng(0), 1)
    result = store.upsert("m", np.concatenate([v, v]), np.array([10.0, 20.0]), now=1.0)
    assert result.created == 1 and result.ids[0] == result.ids[1]
    assert store.count("m") == 1
    again = store.upsert("m", v, np.array([30.0]), now=2.0)
    assert again.created == 0 and again.ids == result.ids[:1]
    [nb] = store.search("m", v, k=4)
    assert len(nb.lengths) == 1 and 10 < nb.lengths[0] < 30


def test_payload_marks_seed_and_observed_points_and_counts_them():
    store = LengthStore(StoreConfig(), dim=16)
    vecs = _unit(np.random.default_rng(3), 6)
    seeded = store.upsert("m", vecs[:4], np.full(4, 100.0), now=0.0, observed=False)
    assert (seeded.created, seeded.newly_observed) == (4, 0)
    store.search("m", vecs[:1], k=1)  # the in-process copy must follow the flag too
    # One new observed point and one seeded point overwritten by the served model's reply.
    result = store.upsert("m", vecs[[4, 0]], np.array([7.0, 9.0]), now=1.0)
    assert (result.created, result.newly_observed) == (1, 2)
    assert (store.count("m", observed=True), store.count("m", observed=False)) == (2, 3)
    [nb] = store.search("m", vecs[:1], k=1)
    assert nb.observed.tolist() == [True] and nb.lengths.tolist() == [9.0]
    _, lengths, observed = store.export("m")
    assert sorted(lengths[observed].tolist()) == [7.0, 9.0]
    store._mirrors = None  # Qdrant itself answers the same
    assert store.count("m", observed=True) == 2
    assert store.search("m", vecs[:1], k=1)[0].observed.tolist() == [True]
    store.close()


def test_observed_completion_replaces_seeded_length():
    merged = merge_payload({"length": 300.0, "count": 5, "observed": False}, 100.0, 1.0, True, 0.25)
    assert merged["length"] == 100.0 and merged["observed"]
    drift = merge_payload({"length": 100.0, "count": 50, "observed": True}, 20.0, 2.0, True, 0.25)
    assert drift["length"] == 80.0  # the weight floor keeps following a drifting model


def test_bound_evicts_seeded_then_oldest():
    store = LengthStore(StoreConfig(max_points_per_model=10, evict_to_fraction=0.8), dim=16)
    vecs = _unit(np.random.default_rng(1), 14)
    store.upsert("m", vecs[:4], np.full(4, 1.0), now=0.0, observed=False)
    for i in range(4, 14):
        store.upsert("m", vecs[i:i + 1], np.array([float(i)]), now=float(i))
    assert store.count("m") <= 10
    _, lengths, observed = store.export("m")
    assert 1.0 not in lengths and observed.all()  # seeded points went first
    assert {12.0, 13.0} <= set(lengths.tolist())


def test_models_are_separate_collections(tmp_path):
    store = LengthStore(StoreConfig(qdrant_path=str(tmp_path / "db")), dim=16)
    v = _unit(np.random.default_rng(2), 1)
    store.upsert("org/model-a:v1", v, np.array([5.0]), now=1.0)
    store.upsert("model-b", v, np.array([50.0]), now=1.0)
    assert store.models() == ["model-b", "org/model-a:v1"]
    store.close()
    reopened = LengthStore(StoreConfig(qdrant_path=str(tmp_path / "db")), dim=16)
    [nb] = reopened.search("org/model-a:v1", v, k=2)
    assert nb.lengths.tolist() == [5.0]  # persisted across a restart
    assert collection_name("p", "a/b") != collection_name("p", "a_b")
    reopened.close()


def test_export_order_does_not_depend_on_insertion_order_or_ids():
    """Same contents, same training set: the MLP's seeded shuffles then repeat run after run."""
    vecs = _unit(np.random.default_rng(5), 40)
    lengths = np.arange(1.0, 41.0)
    exports = []
    for order in (np.arange(40), np.random.default_rng(6).permutation(40)):
        store = LengthStore(StoreConfig(), dim=16)
        store.upsert("m", vecs[order], lengths[order], now=0.0, observed=False)
        exports.append(store.export("m"))
        store.close()
    for a, b in zip(*exports):
        np.testing.assert_array_equal(a, b)
