"""A seeded random run of swap_out / swap_in / free / finish against a shadow copy of every
request's KV: integrity after every step, data checked at every swap-in."""
from __future__ import annotations

import random

import pytest
import torch

from services.executor.kv_cache import BlockAllocator
from services.kvmanager.int8 import dequantize, quantize
from services.kvmanager.interface import HostPoolFullError
from tests.kvmanager.helpers import make_pool

DEVICE_BLOCKS, HOST_BLOCKS, STEPS = 24, 10, 300


class Run:
    def __init__(self, make_manager, seed: int, int8: bool, num_workers: int):
        self.rng = random.Random(seed)
        self.pool = make_pool(num_blocks=DEVICE_BLOCKS, seed=seed)
        self.manager, self.mover = make_manager(self.pool, HOST_BLOCKS, int8=int8,
                                                num_workers=num_workers)
        self.int8 = int8
        self.device = BlockAllocator(DEVICE_BLOCKS)
        self.on_device: dict[str, list[int]] = {}
        self.on_host: set[str] = set()
        self.shadow: dict[str, torch.Tensor] = {}
        self.unwaited = []              # (handle, device blocks to release once it is done)
        self.counter = 0

    def settle(self) -> None:
        """Wait for swap-outs before their device blocks go to anyone else, as the serving
        loop must; then make those blocks garbage."""
        for handle, blocks in self.unwaited:
            handle.wait()
            self.device.free(blocks)
            self.pool.cache[:, :, blocks] = float("nan")
        self.unwaited.clear()

    def new_request(self) -> None:
        self.settle()
        n = self.rng.randint(1, 4)
        if n > self.device.num_free:
            return
        rid, self.counter = f"r{self.counter}", self.counter + 1
        blocks = self.device.allocate(n)
        self.pool.cache[:, :, blocks] = torch.randn(self.pool.cache[:, :, blocks].shape)
        self.on_device[rid] = blocks
        self.shadow[rid] = self.pool.cache[:, :, blocks].clone()

    def swap_out(self, rid: str) -> None:
        free = self.manager.num_free_host_blocks()
        try:
            handle = self.manager.swap_out(rid, self.on_device[rid])
        except HostPoolFullError:
            assert free < len(self.on_device[rid])
            assert self.manager.num_free_host_blocks() == free and not self.manager.holds(rid)
            return
        self.unwaited.append((handle, self.on_device.pop(rid)))
        self.on_host.add(rid)
        if self.rng.random() < 0.3:
            self.settle()

    def swap_in(self, rid: str) -> None:
        self.settle()
        n = self.shadow[rid].shape[2]
        if n > self.device.num_free:
            return
        blocks = self.device.allocate(n)
        self.manager.swap_in(rid, blocks).wait()
        self.on_host.remove(rid)
        self.on_device[rid] = blocks
        want = self.shadow[rid]
        if self.int8:
            want = dequantize(quantize(want), want.dtype)
        assert torch.equal(self.pool.cache[:, :, blocks], want), f"{rid}'s KV changed"
        self.shadow[rid] = want

    def free_on_host(self, rid: str) -> None:
        self.manager.free(rid)          # its swap-out may still be in flight
        self.on_host.remove(rid)
        del self.shadow[rid]

    def finish_on_device(self, rid: str) -> None:
        self.device.free(self.on_device.pop(rid))
        del self.shadow[rid]

    def step(self) -> None:
        ops = [(self.new_request, None)]
        ops += [(op, rid) for rid in self.on_device for op in (self.swap_out, self.swap_out,
                                                               self.finish_on_device)]
        ops += [(op, rid) for rid in self.on_host for op in (self.swap_in, self.free_on_host)]
        op, rid = self.rng.choice(ops)
        op() if rid is None else op(rid)

    def check(self) -> None:
        self.manager.check_integrity()
        self.device.check_integrity()
        assert {r for r in self.on_host if self.manager.holds(r)} == self.on_host


@pytest.mark.parametrize("seed,int8,num_workers", [(0, False, 1), (1, True, 1), (2, False, 2)])
def test_random_swaps_keep_integrity_and_data(seed, int8, num_workers, make_manager):
    run = Run(make_manager, seed, int8, num_workers)
    kinds = set()
    for _ in range(STEPS):
        run.step()
        run.check()
        kinds.add((len(run.on_host) > 0, run.manager.num_free_host_blocks() < 3))
    run.settle()
    assert run.manager.stats().bytes_swapped_in > 0
    assert kinds >= {(True, True), (True, False)}, "the run never filled the host pool"
    for rid in list(run.on_host):
        run.free_on_host(rid)
    assert run.manager.num_free_host_blocks() == HOST_BLOCKS
    run.manager.close()
