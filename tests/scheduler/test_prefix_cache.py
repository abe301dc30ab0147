"""The block manager's prefix cache: exact chained keys, reference-counted sharing, free but
cached blocks evicted least recently freed first, and integrity checks that catch a wrong
holder count or index entry."""
import pytest

from services.scheduler.block_manager import BlockManager

BS = 4


def cached_manager(num_blocks: int = 8) -> BlockManager:
    return BlockManager(num_blocks, BS, enable_prefix_caching=True, cache_namespace=("m", "f32"))


def compute(bm: BlockManager, rid: str, tokens: list[int]) -> None:
    """Allocate and 'compute' the request's tokens, indexing its full blocks."""
    blocks = bm.match_prefix(tokens)
    if blocks:
        bm.claim_prefix(rid, blocks)
    assert bm.allocate_slots(rid, len(tokens))
    bm.cache_computed(rid, tokens, len(tokens))
    bm.check_integrity()


def test_a_shared_prefix_is_held_by_both_and_kept_cached_after_both_leave():
    bm = cached_manager()
    compute(bm, "a", list(range(10)))             # blocks: [0-3] [4-7] + partial
    compute(bm, "b", list(range(8)) + [99, 98])   # shares the two full blocks
    assert bm.block_table("a")[:2] == bm.block_table("b")[:2]
    assert bm.num_free_blocks == 8 - 4
    bm.free("a")
    bm.check_integrity()
    assert bm.num_free_blocks == 8 - 3             # b still holds the shared two
    bm.free("b")
    bm.check_integrity()
    assert bm.num_free_blocks == 8 and len(bm.prefix.free_cached) == 2
    assert len(bm.match_prefix(list(range(9)))) == 2       # still served after both left


def test_hash_equal_but_different_tokens_are_never_served():
    bm = cached_manager()
    tokens = [5, 6, 7, 8, 9]
    compute(bm, "a", tokens)
    # In CPython hash(n) == hash(n + 2**61 - 1) and hash(-1) == hash(-2): same dict slot,
    # different tokens. The index compares keys in full, so these miss.
    twin = [t + 2**61 - 1 for t in tokens[:4]] + [9]
    assert [hash(t) for t in twin[:4]] == tokens[:4]
    assert bm.match_prefix(twin) == []
    compute(bm, "m1", [-1, 1, 1, 1, 0])
    assert bm.match_prefix([-2, 1, 1, 1, 0]) == []


def test_the_namespace_and_the_parent_are_part_of_the_key():
    bm, other = cached_manager(), BlockManager(8, BS, enable_prefix_caching=True,
                                               cache_namespace=("m", "f16"))
    compute(bm, "a", [1, 2, 3, 4, 5, 6, 7, 8, 0])
    assert bm.prefix.root != other.prefix.root
    # Same second block after a different first one: no hit on either.
    assert bm.match_prefix([9, 9, 9, 9, 5, 6, 7, 8, 0]) == []


def test_free_cached_blocks_are_evicted_only_when_needed_and_lru_first():
    bm = cached_manager(num_blocks=6)
    compute(bm, "old", [1] * 8 + [0])              # 3 blocks, 2 indexed
    bm.free("old")
    compute(bm, "new", [2] * 8 + [0])              # 3 blocks, 2 indexed
    bm.free("new")
    assert len(bm.prefix.free_cached) == 4 and bm.num_free_uncached_blocks == 2
    assert bm.allocate_slots("x", 8)               # the two plain free blocks first
    assert len(bm.prefix.free_cached) == 4
    assert bm.allocate_slots("x", 12)              # then one eviction: the oldest freed
    assert len(bm.match_prefix([1] * 8 + [0])) < 2 and len(bm.match_prefix([2] * 8 + [0])) == 2
    assert bm.prefix.num_evicted == 1
    bm.check_integrity()


def test_swap_out_defers_only_blocks_nobody_else_holds():
    bm = cached_manager()
    compute(bm, "a", list(range(9)))
    compute(bm, "b", list(range(8)) + [50, 51])
    bm.free("a", defer=True)                       # a's copy reads its blocks
    assert bm.num_deferred_blocks == 1             # the shared two stay with b
    bm.release_deferred()
    bm.check_integrity()


def test_lending_a_shared_block_is_refused_and_lent_blocks_are_never_indexed():
    bm = cached_manager()
    compute(bm, "a", list(range(8)) + [9])
    compute(bm, "b", list(range(8)) + [9, 10])
    with pytest.raises(ValueError, match="shares"):
        bm.lend("a", "c", 3, 0)
    assert bm.allocate_slots("b", 24)
    bm.lend("b", "g", 2, 12)
    bm.cache_computed("g", list(range(8)), 8)      # the borrower computes into the loan
    assert not any(bm.prefix.is_cached(b) for b in bm.block_table("g"))
    bm.check_integrity()


def test_integrity_catches_a_wrong_holder_count_and_a_stale_index_entry():
    bm = cached_manager()
    compute(bm, "a", list(range(9)))
    bm._ref[bm.block_table("a")[0]] += 1
    with pytest.raises(AssertionError, match="holders counted"):
        bm.check_integrity()
    bm._ref[bm.block_table("a")[0]] -= 1
    bm.free("a")
    cached = next(iter(bm.prefix.free_cached))
    bm._free.append(cached)                        # free twice: cached and plain
    with pytest.raises(AssertionError):
        bm.check_integrity()


def test_reset_forgets_every_cached_block():
    bm = cached_manager()
    compute(bm, "a", list(range(9)))
    bm.free("a")
    bm.reset_prefix_cache()
    assert bm.match_prefix(list(range(9))) == [] and bm.num_free_blocks == 8
    bm.check_integrity()
