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


def test_a_borrower_lends_on_and_blocks_go_back_to_the_nearest_running_lender():
    bm = BlockManager(num_blocks=8, block_size=4)
    bm.allocate_slots("host", 32)
    bm.lend("host", "guest", 4, lender_needs_tokens=16)          # blocks 4-7
    assert bm.lend("guest", "inner", 2, lender_needs_tokens=8) == [6, 7]
    bm.check_integrity()
    bm.free("inner")                              # back to the guest, still lent by the host
    assert bm.block_table("guest") == [4, 5, 6, 7]
    bm.lend("guest", "inner", 2, lender_needs_tokens=8)
    bm.free("guest")                              # the guest's own loan goes home at once...
    assert bm.num_blocks_of("host") == 6
    bm.free("inner")                              # ...and the inner one skips the finished guest
    assert sorted(bm.block_table("host")) == list(range(8)) and bm.num_free_blocks == 0
    bm.check_integrity()
    bm.lend("host", "guest", 4, lender_needs_tokens=16)
    bm.lend("guest", "inner", 2, lender_needs_tokens=8)
    bm.free("host")
    bm.free("guest")
    bm.free("inner")                              # every lender gone: the free pool
    assert bm.num_free_blocks == 8
    bm.check_integrity()


def test_a_reused_lender_id_never_inherits_a_stale_loan():
    # The lender finishes while its loan is out; a new request takes the same id. When the
    # borrower frees, the lent blocks belong to no one: they must go to the free pool, not
    # into the newcomer's table (the newcomer never lent anything).
    bm = BlockManager(num_blocks=8, block_size=4)
    assert bm.allocate_slots("host", 16)
    bm.lend("host", "guest", 2, lender_needs_tokens=8)
    bm.free("host")
    assert bm.allocate_slots("host", 4)          # same id, new request, one block
    bm.free("guest")
    assert bm.num_blocks_of("host") == 1
    assert bm.num_free_blocks == 7
    bm.check_integrity()


def test_deferred_blocks_are_not_handed_out_until_released():
    bm = BlockManager(num_blocks=4, block_size=4)
    assert bm.allocate_slots("a", 16)
    table = list(bm.block_table("a"))
    assert bm.free("a", defer=True) == table
    assert bm.num_free_blocks == 0 and bm.num_deferred_blocks == 4
    assert not bm.allocate_slots("b", 4)
    bm.check_integrity()
    assert bm.release_deferred() == 4 and bm.allocate_slots("b", 16)
    bm.check_integrity()


def test_epoch_changes_only_when_a_table_is_rewritten():
    bm = BlockManager(num_blocks=8, block_size=4)
    bm.allocate_slots("a", 4)
    e = bm.epoch("a")
    bm.allocate_slots("a", 12)                   # appends keep the epoch
    assert bm.epoch("a") == e
    bm.lend("a", "b", 1, lender_needs_tokens=8)  # the lender's tail moved away
    assert bm.epoch("a") != e
    e2 = bm.epoch("a")
    bm.free("b")                                 # and came back
    assert bm.epoch("a") != e2
