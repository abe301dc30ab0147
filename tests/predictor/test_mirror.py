import numpy as np

from services.predictor.config import StoreConfig
from services.predictor.store import LengthStore


def _unit(n, dim, seed):
    v = np.random.default_rng(seed).normal(size=(n, dim)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def test_in_process_search_matches_qdrant_after_inserts_and_merges():
    store = LengthStore(StoreConfig(), dim=16)
    vecs = _unit(50, 16, 0)
    store.upsert("m", vecs[:30], np.arange(30, dtype=np.float32), 0.0, observed=False)
    queries = _unit(5, 16, 1)
    store.search("m", queries, 4)  # builds the copy, which later writes must keep exact
    store.upsert("m", np.concatenate([vecs[30:], vecs[:3]]), np.full(23, 99, np.float32), 1.0)
    mine = store.search("m", queries, 4)
    store._mirrors = None  # the same store, answered by Qdrant itself
    theirs = store.search("m", queries, 4)
    for a, b in zip(mine, theirs):
        np.testing.assert_allclose(a.scores, b.scores, atol=1e-5)
        np.testing.assert_allclose(a.lengths, b.lengths)
        np.testing.assert_array_equal(a.observed, b.observed)
    assert any(nb.observed.any() and not nb.observed.all() for nb in mine)  # both kinds met
    store.close()


def test_empty_collection_searches_empty():
    store = LengthStore(StoreConfig(), dim=8)
    store.upsert("m", _unit(1, 8, 0), np.ones(1, np.float32), 0.0)
    [hit] = store.search("m", _unit(1, 8, 1), 3)
    assert len(hit.scores) == len(hit.lengths) == 1
    store.close()


def test_search_stays_exact_as_many_small_batches_grow_the_copy():
    # One observed batch at a time, as in service: the copy grows its buffers past their
    # capacity several times, and merged points update lengths in place.
    store = LengthStore(StoreConfig(), dim=8)
    vecs = _unit(300, 8, 2)
    store.upsert("m", vecs[:5], np.ones(5, np.float32), 0.0, observed=False)
    queries = _unit(7, 8, 3)
    store.search("m", queries, 6)
    for i in range(5, 300, 3):
        store.upsert("m", vecs[i:i + 3], np.full(3, i, np.float32), float(i))
    store.upsert("m", vecs[:4], np.full(4, 500, np.float32), 400.0)  # merges, seeds observed
    mine = store.search("m", queries, 6)
    assert len(store._mirrors[next(iter(store._mirrors))].ids) == 300
    store._mirrors = None
    theirs = store.search("m", queries, 6)
    for a, b in zip(mine, theirs):
        np.testing.assert_allclose(a.scores, b.scores, atol=1e-5)
        np.testing.assert_allclose(a.lengths, b.lengths)
        np.testing.assert_array_equal(a.observed, b.observed)
    store.close()
