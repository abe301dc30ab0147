"""Pins on cached blocks (``prefix_pins``): a pinned block survives the LRU, still counts as
free, is taken only once nothing else is free, and leaves nothing behind when released or
when the cache is reset."""
import pytest
from test_prefix_cache import compute, cached_manager


def _pinned_prefix():
    bm = cached_manager(8)
    compute(bm, "a", list(range(10)))       # 2 full cached blocks + a partial one
    bm.free("a")
    head = bm.match_prefix(list(range(9)))
    for block in head:
        bm.pins.pin("next", block)
    bm.check_integrity()
    return bm, head


def test_a_pinned_prefix_outlives_the_lru_and_still_counts_as_free():
    bm, head = _pinned_prefix()
    assert bm.num_free_blocks == 8 and len(bm.pins) == 2
    compute(bm, "x", [50 + i for i in range(24)])       # 6 blocks: every unpinned one
    assert bm.match_prefix(list(range(9))) == head      # the LRU did not take the pins
    bm.pins.release("next")
    bm.check_integrity()
    assert list(bm.prefix.free_cached)[-2:] == head     # cached again, most recent


def test_an_allocation_takes_pinned_blocks_last_tail_first():
    bm, head = _pinned_prefix()
    compute(bm, "x", [50 + i for i in range(28)])       # 7 blocks: one pin must go
    assert bm.pins.of["next"] == head[:1] and bm.match_prefix(list(range(9))) == head[:1]
    assert not bm.can_allocate("y", 8)                  # only the claimed head is left
    bm.free("x")
    bm.pins.release("next")
    bm.check_integrity()


def test_integrity_catches_a_lost_pin_and_a_reset_drops_every_pin():
    bm, head = _pinned_prefix()
    bm.pins.owner.pop(head[0])
    with pytest.raises(AssertionError, match="pin maps"):
        bm.check_integrity()
    bm, head = _pinned_prefix()
    bm.reset_prefix_cache()
    bm.check_integrity()
    assert not len(bm.pins) and bm.num_free_uncached_blocks == 8
