import pytest

from services.scheduler.block_manager import BlockManager


def test_allocate_is_all_or_nothing():
    bm = BlockManager(num_blocks=4, block_size=4)
    assert bm.allocate_slots("a", 9)            # 3 blocks
    assert bm.block_table("a") == [0, 1, 2]
    assert not bm.allocate_slots("b", 8)        # needs 2, 1 free
    assert bm.num_blocks_of("b") == 0 and bm.num_free_blocks == 1
    assert bm.allocate_slots("a", 12)           # still 3 blocks: no new allocation
    assert bm.num_free_blocks == 1
    bm.check_integrity()


def test_free_returns_blocks_and_integrity_holds():
    bm = BlockManager(num_blocks=6, block_size=2)
    bm.allocate_slots("a", 5)
    bm.allocate_slots("b", 2)
    assert bm.free("a") == [0, 1, 2]
    assert bm.num_free_blocks == 5
    bm.check_integrity()
    bm.allocate_slots("c", 6)
    assert sorted(bm.block_table("c") + bm.block_table("b")) == [0, 1, 2, 3]
    bm.check_integrity()


def test_check_integrity_catches_double_ownership_and_leaks():
    bm = BlockManager(num_blocks=4, block_size=4)
    bm.allocate_slots("a", 4)
    bm._tables["b"] = [bm.block_table("a")[0]]
    with pytest.raises(AssertionError, match="owned by both"):
        bm.check_integrity()
    bm = BlockManager(num_blocks=4, block_size=4)
    bm.allocate_slots("a", 4)
    bm._tables["a"].clear()
    with pytest.raises(AssertionError, match="leaked"):
        bm.check_integrity()


def test_lending_moves_unused_tail_and_returns_it():
    bm = BlockManager(num_blocks=8, block_size=4)
    bm.allocate_slots("host", 32)               # exact allocation for a predicted length
    with pytest.raises(ValueError, match="at most 4"):
        bm.lend("host", "guest", 5, lender_needs_tokens=16)
    lent = bm.lend("host", "guest", 3, lender_needs_tokens=16)
    assert lent == [5, 6, 7] and bm.block_table("guest") == lent
    assert bm.num_blocks_of("host") == 5
    bm.check_integrity()
    bm.free("guest")
    assert bm.block_table("host") == [0, 1, 2, 3, 4, 5, 6, 7]
    assert bm.num_free_blocks == 0
    bm.check_integrity()


def test_loan_outliving_its_lender_goes_to_the_free_pool():
    bm = BlockManager(num_blocks=4, block_size=4)
    bm.allocate_slots("host", 16)
    bm.lend("host", "guest", 2, lender_needs_tokens=8)
    bm.free("host")
    assert bm.num_free_blocks == 2
    bm.free("guest")
    assert bm.num_free_blocks == 4
    bm.check_integrity()
