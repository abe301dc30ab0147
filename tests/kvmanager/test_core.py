"""The in-process KV manager over a real device pool: exact and INT8 round trips, a full host
pool, copy failures, free during a copy, bad input, and a randomised run of swaps."""
from __future__ import annotations

import threading

import pytest
import torch

from lenserve_contract.errors import InvalidRequestError
from services.kvmanager.int8 import dequantize, element_scale, quantize
from services.kvmanager.interface import HostPoolFullError, RequestNotHeldError
from tests.kvmanager.helpers import host_block_bytes, make_pool

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def blocks(pool, ids) -> torch.Tensor:
    return pool.cache[:, :, ids].clone()


def scribble(pool, ids) -> None:
    """What another request would leave in freed device blocks."""
    pool.cache[:, :, ids] = torch.full_like(pool.cache[:, :, ids], -7.0)


def fragment(manager, num_holes: int) -> None:
    """Leave the host pool's free blocks scattered, so no swap gets a consecutive run."""
    for i in range(2 * num_holes):
        manager.swap_out(f"filler{i}", [i]).wait()
    for i in range(0, 2 * num_holes, 2):
        manager.free(f"filler{i}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("host_layout", ["run", "fragmented"])
def test_round_trip_is_bit_identical_into_other_device_blocks(dtype, host_layout, make_manager):
    pool = make_pool(dtype=dtype)
    manager, _ = make_manager(pool, host_blocks=8)
    if host_layout == "fragmented":
        fragment(manager, num_holes=3)
    free_before = manager.num_free_host_blocks()
    original = blocks(pool, [3, 7, 1])
    manager.swap_out("r", [3, 7, 1]).wait()
    assert manager.holds("r") and manager.num_free_host_blocks() == free_before - 3
    scribble(pool, [3, 7, 1, 10, 2, 5])
    manager.swap_in("r", [10, 2, 5]).wait()
    assert torch.equal(blocks(pool, [10, 2, 5]), original)
    assert not manager.holds("r") and manager.num_free_host_blocks() == free_before
    manager.check_integrity()
    stats = manager.stats()
    assert stats.bytes_swapped_in == 3 * pool.block_bytes
    assert stats.bytes_swapped_out == stats.bytes_swapped_in + 2 * 3 * pool.block_bytes * (
        host_layout == "fragmented")


@pytest.mark.parametrize("dtype", DTYPES)
def test_int8_round_trip_is_the_quantized_blocks_within_the_bound(dtype, make_manager):
    pool = make_pool(dtype=dtype, seed=3)
    manager, _ = make_manager(pool, host_blocks=8, int8=True)
    original = blocks(pool, [0, 4])
    manager.swap_out("r", [0, 4]).wait()
    stats = manager.stats()
    assert stats.int8 and stats.host_bytes_used == 2 * host_block_bytes(pool, int8=True)
    assert stats.host_bytes_used < 2 * pool.block_bytes
    scribble(pool, [0, 4, 9, 6])
    manager.swap_in("r", [9, 6]).wait()
    arrived = blocks(pool, [9, 6])
    q = quantize(original)
    assert torch.equal(arrived, dequantize(q, dtype))
    scale = element_scale(q)
    # Half a step in fp32, one step once narrowed to a 16-bit dtype (see test_int8).
    bound = scale * (0.5 if dtype == torch.float32 else 1.0)
    assert ((arrived.float() - original.float()).abs() <= bound + 1e-6 * original.abs()).all()
    assert not torch.equal(arrived, original)       # it really went through INT8
    manager.check_integrity()


def test_int8_ignores_the_stale_tail_of_the_last_block(make_manager):
    pool = make_pool(seed=5)
    manager, _ = make_manager(pool, host_blocks=4, int8=True)
    pool.cache[:, :, 2, 9:] = float("nan")          # slots 9.. of the last block: stale
    original = blocks(pool, [1, 2])
    manager.swap_out("r", [1, 2], num_tokens=pool.block_size + 9).wait()
    manager.swap_in("r", [6, 7]).wait()
    arrived = blocks(pool, [6, 7])
    assert not arrived.isnan().any()
    step = element_scale(quantize(original, pool.block_size + 9))[:, :, :1]
    assert ((arrived[:, :, :1] - original[:, :, :1]).abs() <= step * (0.5 + 1e-4)).all()
    err_tail = (arrived[:, :, 1, :9] - original[:, :, 1, :9]).abs()
    assert err_tail.max() < (original[:, :, 1, :9].abs().max()) / 100


@pytest.mark.parametrize("num_tokens", [0, 16, 33, 2.5])
def test_a_token_count_that_does_not_fit_is_refused_before_reserving(num_tokens, make_manager):
    pool = make_pool()
    manager, mover = make_manager(pool, host_blocks=4, int8=True)
    with pytest.raises(InvalidRequestError, match="num_tokens"):
        manager.swap_out("r", [1, 2], num_tokens=num_tokens)
    assert manager.num_free_host_blocks() == 4 and mover.calls == 0


def test_a_full_pool_is_refused_and_nothing_changes(make_manager):
    pool = make_pool()
    manager, mover = make_manager(pool, host_blocks=4)
    manager.swap_out("a", [0, 1, 2]).wait()
    calls = mover.calls
    with pytest.raises(HostPoolFullError) as err:
        manager.swap_out("b", [3, 4])
    assert (err.value.num_blocks, err.value.num_free) == (2, 1)
    assert manager.num_free_host_blocks() == 1 and not manager.holds("b")
    assert mover.calls == calls and not manager.can_hold(2) and manager.can_hold(1)
    manager.check_integrity()
    assert manager.stats().num_swapped_requests == 1


def test_zero_swap_space_refuses_every_swap(make_manager):
    pool = make_pool()
    manager, _ = make_manager(pool, host_blocks=0)
    with pytest.raises(HostPoolFullError):
        manager.swap_out("a", [0])
    manager.check_integrity()


def test_a_copy_error_surfaces_from_wait_and_frees_the_host_blocks(make_manager):
    pool = make_pool()
    manager, mover = make_manager(pool, host_blocks=4)
    mover.fail = "device lost"
    handle = manager.swap_out("a", [0, 1])
    with pytest.raises(RuntimeError, match="device lost"):
        handle.wait()
    assert handle.done() and not manager.holds("a")
    assert manager.num_free_host_blocks() == 4
    manager.check_integrity()
    with pytest.raises(RequestNotHeldError, match="swap-out failed.*device lost"):
        manager.swap_in("a", [5, 6])
    assert manager.stats().bytes_swapped_out == 0


def test_a_failed_swap_in_keeps_the_host_copy_for_a_retry(make_manager):
    pool = make_pool()
    manager, mover = make_manager(pool, host_blocks=4)
    original = blocks(pool, [0, 1])
    manager.swap_out("a", [0, 1]).wait()
    mover.fail = "link down"
    with pytest.raises(RuntimeError, match="link down"):
        manager.swap_in("a", [5, 6]).wait()
    assert manager.holds("a") and manager.num_free_host_blocks() == 2
    manager.check_integrity()
    mover.fail = None
    manager.swap_in("a", [8, 9]).wait()
    assert torch.equal(blocks(pool, [8, 9]), original)
    assert manager.num_free_host_blocks() == 4 and manager.stats().bytes_swapped_in > 0


def test_a_swap_in_issued_before_its_swap_out_fails_fails_too(make_manager):
    pool = make_pool()
    manager, mover = make_manager(pool, host_blocks=4)
    mover.gate.clear()
    mover.fail = "boom"
    out = manager.swap_out("a", [0, 1])
    into = manager.swap_in("a", [5, 6])
    assert not out.done() and not into.done()
    mover.gate.set()
    for handle in (out, into):
        with pytest.raises(RuntimeError, match="boom"):
            handle.wait()
    assert not manager.holds("a") and manager.num_free_host_blocks() == 4
    manager.check_integrity()


def test_swap_in_waits_for_its_own_swap_out(make_manager):
    pool = make_pool()
    manager, mover = make_manager(pool, host_blocks=4)
    original = blocks(pool, [2, 3])
    mover.gate.clear()
    out = manager.swap_out("a", [2, 3])
    into = manager.swap_in("a", [12, 13])
    assert not out.done() and not into.done()
    mover.gate.set()
    into.wait()
    assert out.done() and torch.equal(blocks(pool, [12, 13]), original)


def test_free_waits_for_the_copy_in_flight(make_manager):
    pool = make_pool()
    manager, mover = make_manager(pool, host_blocks=4)
    mover.gate.clear()
    handle = manager.swap_out("a", [0, 1, 2])
    assert not handle.done() and manager.num_free_host_blocks() == 1
    opener = threading.Timer(0.2, mover.gate.set)
    opener.start()
    manager.free("a")
    assert handle.done(), "free returned while the copy could still write the host blocks"
    handle.wait()
    assert not manager.holds("a") and manager.num_free_host_blocks() == 4
    manager.check_integrity()
    manager.free("a")                       # no-op once gone
    manager.free("never-seen")


def test_swap_out_again_waits_for_the_swap_in_in_flight(make_manager):
    pool = make_pool()
    manager, mover = make_manager(pool, host_blocks=4)
    original = blocks(pool, [0, 1])
    manager.swap_out("a", [0, 1]).wait()
    mover.gate.clear()
    manager.swap_in("a", [4, 5])
    with pytest.raises(RequestNotHeldError, match="already in flight"):
        manager.swap_in("a", [6, 7])
    threading.Timer(0.2, mover.gate.set).start()
    manager.swap_out("a", [4, 5]).wait()
    manager.check_integrity()
    scribble(pool, [4, 5])
    manager.swap_in("a", [6, 7]).wait()
    assert torch.equal(blocks(pool, [6, 7]), original)


def test_bad_input_is_refused_and_nothing_changes(make_manager):
    pool = make_pool()
    manager, _ = make_manager(pool, host_blocks=4)
    with pytest.raises(RequestNotHeldError, match="'x' has no KV in the host pool") as err:
        manager.swap_in("x", [0])
    assert isinstance(err.value, KeyError)
    for bad, match in (([], "at least one"), ([0, 16], "unknown"), ([1, 1], "repeat"),
                       ([0.5], "unknown"), ([True], "unknown")):
        with pytest.raises(InvalidRequestError, match=match):
            manager.swap_out("a", bad)
    assert manager.num_free_host_blocks() == 4
    manager.swap_out("a", [0, 1]).wait()
    with pytest.raises(ValueError, match="already swapped out"):
        manager.swap_out("a", [2])
    with pytest.raises(InvalidRequestError, match="from 2 blocks, cannot swap in to 3"):
        manager.swap_in("a", [5, 6, 7])
    assert manager.holds("a")
    manager.check_integrity()


def test_close_finishes_copies_and_then_refuses_work(make_manager):
    pool = make_pool()
    manager, mover = make_manager(pool, host_blocks=4)
    mover.gate.clear()
    handle = manager.swap_out("a", [0])
    threading.Timer(0.2, mover.gate.set).start()
    manager.close()
    assert handle.done()
    manager.close()
    with pytest.raises(RuntimeError, match="closed"):
        manager.swap_out("b", [1])


def test_several_workers_keep_every_request_intact(make_manager):
    pool = make_pool(num_blocks=32)
    manager, _ = make_manager(pool, host_blocks=16, num_workers=3)
    sources = {f"r{i}": [4 * i, 4 * i + 1, 4 * i + 2] for i in range(4)}
    originals = {rid: blocks(pool, ids) for rid, ids in sources.items()}
    handles = [manager.swap_out(rid, ids) for rid, ids in sources.items()]
    manager.wait_all()
    assert all(h.done() for h in handles)
    targets = {rid: [31 - b for b in ids] for rid, ids in sources.items()}
    for rid, ids in targets.items():
        manager.swap_in(rid, ids)
    manager.wait_all()
    for rid, ids in targets.items():
        assert torch.equal(blocks(pool, ids), originals[rid])
    assert manager.num_free_host_blocks() == 16
    manager.check_integrity()
