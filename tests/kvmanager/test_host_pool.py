"""Host block pool: sizing from real block bytes, all-or-nothing allocation, integrity."""
from __future__ import annotations

import pytest
import torch

from services.kvmanager.host_pool import HostBlockAllocator, HostBlockPool
from services.kvmanager.host_store import BlockLayout
from services.kvmanager.interface import HostPoolFullError

LAYOUT = BlockLayout(num_layers=2, block_size=16, num_kv_heads=3, head_dim=8,
                     dtype=torch.float16)


def test_pool_size_follows_the_real_bytes_of_a_host_block():
    channels = 2 * 2 * 3 * 8
    fp_bytes = channels * 16 * 2
    # codes + a 16-bit scale and offset per channel for every 8 blocks (one group)
    int8_bytes = channels * 16 + channels // 8 * (2 + 2)
    space = 10 * fp_bytes + 1
    fp = HostBlockPool(LAYOUT, space, int8=False, pin=False)
    q = HostBlockPool(LAYOUT, space, int8=True, pin=False)
    assert (fp.block_bytes, fp.num_blocks) == (fp_bytes, 10)
    assert (q.block_bytes, q.num_blocks) == (int8_bytes, space // int8_bytes)
    assert fp.store.data.shape == (2, 2, 10, 16, 3, 8) and fp.store.data.dtype == torch.float16
    assert q.store.codes.dtype == torch.uint8 and q.store.scale.shape == (2, 2, q.num_blocks, 3)
    assert HostBlockPool(LAYOUT, 0, int8=False, pin=False).num_blocks == 0


def test_allocation_is_all_or_nothing():
    alloc = HostBlockAllocator(8)
    assert alloc.allocate("a", 5) == [0, 1, 2, 3, 4]
    with pytest.raises(HostPoolFullError) as err:
        alloc.allocate("b", 4)
    assert (err.value.request_id, err.value.num_blocks, err.value.num_free) == ("b", 4, 3)
    assert alloc.num_free == 3 and alloc.owners() == ["a"]
    alloc.check_integrity()
    with pytest.raises(ValueError, match="already owns"):
        alloc.allocate("a", 1)
    with pytest.raises(ValueError, match="at least one"):
        alloc.allocate("c", 0)


def test_a_consecutive_run_is_preferred_then_any_free_blocks():
    alloc = HostBlockAllocator(10)
    for owner, n in (("a", 2), ("b", 3), ("c", 2), ("d", 3)):
        alloc.allocate(owner, n)
    alloc.release("a")
    alloc.release("c")                  # free: 0-1 and 5-6
    assert alloc.allocate("e", 2) == [0, 1]
    alloc.release("e")
    alloc.release("d")                  # free: 0-1, 5-9
    assert alloc.allocate("f", 4) == [5, 6, 7, 8]
    assert alloc.allocate("g", 3) == [0, 1, 9]      # no run of 3 left: fragments
    alloc.check_integrity()
    assert alloc.num_free == 0


@pytest.mark.parametrize("damage,message", [
    (lambda a: a._owned["a"].append(2), "owned twice"),
    (lambda a: a._free.__setitem__(0, True), "both free and owned"),
    (lambda a: a._free.__setitem__(9, False), "free count"),
    (lambda a: setattr(a, "_num_free", a._num_free - 1), "free count"),
    (lambda a: a._owned.pop("b"), "lost"),
])
def test_integrity_check_catches_damage(damage, message):
    alloc = HostBlockAllocator(10)
    alloc.allocate("a", 3)
    alloc.allocate("b", 2)
    alloc.check_integrity()
    damage(alloc)
    with pytest.raises(AssertionError, match=message):
        alloc.check_integrity()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without CUDA")
def test_pinning_without_cuda_is_refused():
    from services.kvmanager.config import KVManagerConfig
    from services.kvmanager.core import InProcessKVManager
    from tests.kvmanager.helpers import TinyMover, make_pool, model_info

    pool = make_pool()
    with pytest.raises(ValueError, match="pin_memory=True needs CUDA"):
        InProcessKVManager(KVManagerConfig(0.001, pin_memory=True), TinyMover(pool),
                           model_info(pool))
