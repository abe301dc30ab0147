"""The in-process KV manager: host block pool + asynchronous copies through a mover.

The mover is executor-like: ``export_blocks(block_ids, out=None)`` and ``import_blocks``, and
optionally ``staging(shape, dtype)``, a host buffer it moves without a copy of its own (the
gRPC executor client's shared memory).
Copies run on worker threads (see ``copier``); everything else -- which request owns which
host blocks, the stats -- changes only on the caller's thread. Finished copies are settled
("reaped") at the start of every call, so after ``handle.wait()`` the next call already sees
the swap-in's host blocks freed. One caller thread; handles may be waited on from any thread.

A request is *held* from ``swap_out`` until ``swap_in``, *incoming* while its swap-in runs;
in both states it owns its host blocks. A failed swap-out drops the host copy (the caller
still has the device copy: it waits before reusing those blocks); a failed swap-in keeps it
held, so the caller can retry or free it.
"""
from __future__ import annotations

import operator
from concurrent.futures import Future, wait
from dataclasses import dataclass
from functools import partial

import torch

from lenserve_contract.errors import InvalidRequestError
from services.executor.types import ModelInfo
from services.kvmanager.config import KVManagerConfig
from services.kvmanager.copier import Copier, FutureHandle
from services.kvmanager.host_pool import HostBlockPool
from services.kvmanager.host_store import BlockLayout
from services.kvmanager.interface import KVManager, KVStats, RequestNotHeldError, SwapHandle


@dataclass(eq=False)
class _Swap:
    request_id: str
    host_blocks: list[int]
    out: Future                     # the swap-out copy
    into: Future | None = None      # the swap-in copy, once started
    counted: bool = False           # the swap-out's bytes are in the stats
    streamed: bool = False          # its host blocks grow with streamed iterations


class InProcessKVManager(KVManager):
    def __init__(self, config: KVManagerConfig, mover, block_shape_info: ModelInfo, *,
                 device: str | torch.device | None = None):
        """``device``: where the mover's KV lives (default: ``mover.device``, else the CPU);
        it decides pinning and the CUDA side stream."""
        device = torch.device(device if device is not None else getattr(mover, "device", "cpu"))
        pin = config.pin(device.type)
        if pin and not torch.cuda.is_available():
            raise ValueError("pin_memory=True needs CUDA, and this process has no CUDA device")
        self.config, self.mover = config, mover
        self.layout = BlockLayout.from_model_info(block_shape_info)
        self.num_gpu_blocks = block_shape_info.num_gpu_blocks
        self.pool = HostBlockPool(self.layout, config.swap_space_bytes, config.int8, pin)
        self.copier = Copier(config.num_workers, device, pin)
        self._held: dict[str, _Swap] = {}
        self._incoming: dict[str, _Swap] = {}
        self._failed_out: dict[str, BaseException] = {}
        self._bytes_out = self._bytes_in = 0
        self._link_out = self._link_in = 0
        self._closed = False

    # -- queries --------------------------------------------------------------------------

    @property
    def num_host_blocks(self) -> int:
        self._check_open()
        return self.pool.num_blocks

    @property
    def host_block_bytes(self) -> int:
        return self.pool.block_bytes

    @property
    def copies_overlap(self) -> bool:
        return self.copier.on_side_stream

    def num_free_host_blocks(self) -> int:
        self._enter()
        return self.pool.num_free

    def holds(self, request_id: str) -> bool:
        self._enter()
        return request_id in self._held

    def stats(self) -> KVStats:
        self._enter()
        return KVStats(
            num_host_blocks=self.pool.num_blocks, num_free_host_blocks=self.pool.num_free,
            host_bytes_used=self.pool.bytes_used, int8=self.pool.int8,
            num_swapped_requests=len(self._held) + len(self._incoming),
            bytes_swapped_out=self._bytes_out, bytes_swapped_in=self._bytes_in,
            link_bytes_out=self._link_out, link_bytes_in=self._link_in)

    # -- swaps ----------------------------------------------------------------------------

    def swap_out(self, request_id: str, device_blocks: list[int],
                 num_tokens: int | None = None) -> SwapHandle:
        self._enter()
        blocks = self._device_ids(device_blocks)
        self._check_num_tokens(num_tokens, len(blocks))
        if request_id in self._held:
            raise ValueError(f"request {request_id!r} is already swapped out")
        self._settle_incoming(request_id)
        host = self.pool.allocator.allocate(request_id, len(blocks))
        self._failed_out.pop(request_id, None)
        future = self.copier.submit(partial(self._copy_out, blocks, host, num_tokens))
        self._held[request_id] = _Swap(request_id, host, future)
        return FutureHandle(future)

    def swap_in(self, request_id: str, device_blocks: list[int]) -> SwapHandle:
        self._enter()
        blocks = self._device_ids(device_blocks)
        swap = self._held.get(request_id)
        if swap is None:
            raise RequestNotHeldError(request_id, self._why_not_held(request_id))
        if swap.streamed and len(blocks) < len(swap.host_blocks):
            # Grown for a streamed iteration that did not run: the tail holds no KV.
            swap.host_blocks = self.pool.allocator.shrink(request_id, len(blocks))
        if len(blocks) != len(swap.host_blocks):
            raise InvalidRequestError(
                f"request {request_id!r} was swapped out from {len(swap.host_blocks)} blocks, "
                f"cannot swap in to {len(blocks)}", field="device_blocks")
        swap.into = self.copier.submit(partial(self._copy_in, swap.host_blocks, blocks),
                                       after=swap.out)
        self._incoming[request_id] = self._held.pop(request_id)
        return FutureHandle(swap.into)

    def stream_source(self) -> torch.Tensor | None:
        self._check_open()
        return None if self.pool.int8 else self.pool.store.data

    def stream_blocks(self, request_id: str, num_tokens: int) -> list[int]:
        self._enter()
        swap = self._held.get(request_id)
        if swap is not None:
            wait([swap.out])        # attention must read what the swap-out wrote
            self._reap()
            swap = self._held.get(request_id)
        if swap is None:
            raise RequestNotHeldError(request_id, self._why_not_held(request_id))
        need = -(-num_tokens // self.layout.block_size)
        if need > len(swap.host_blocks):
            swap.host_blocks = self.pool.allocator.extend(request_id,
                                                          need - len(swap.host_blocks))
        elif need < len(swap.host_blocks):  # an earlier streamed iteration did not run
            swap.host_blocks = self.pool.allocator.shrink(request_id, need)
        swap.streamed = True
        return list(swap.host_blocks)

    def free(self, request_id: str) -> None:
        """Also forgets a failed swap-out; no-op while the request's swap-in is in flight
        (its blocks are freed when that copy ends)."""
        self._enter()
        self._failed_out.pop(request_id, None)
        swap = self._held.pop(request_id, None)
        if swap is None:
            return
        wait([swap.out])        # the copy may still be writing into these host blocks
        if swap.out.exception() is None:
            self._count_out(swap)
        self.pool.allocator.release(request_id)

    def free_all(self) -> int:
        """Wait for every copy, then free every request's host blocks; how many were freed."""
        self.wait_all()
        owners = self.pool.allocator.owners()
        for rid in owners:
            self.free(rid)
        return len(owners)

    def wait_all(self) -> None:
        """Waits without raising: each copy's error is its handle's to report."""
        self._check_open()
        swaps = [*self._held.values(), *self._incoming.values()]
        wait([f for s in swaps for f in (s.out, s.into) if f is not None])
        self._reap()

    def check_integrity(self) -> None:
        self._check_open()
        self.pool.check_integrity()
        assert not set(self._held) & set(self._incoming), "a request is held and incoming"
        swaps = {**self._held, **self._incoming}
        assert set(self.pool.allocator.owners()) == set(swaps), "host owners != swapped requests"
        for rid, swap in swaps.items():
            assert self.pool.allocator.blocks_of(rid) == swap.host_blocks, f"{rid}'s blocks moved"

    def close(self) -> None:
        if self._closed:
            return
        self.wait_all()
        self.copier.shutdown()
        self._closed = True
        self._held.clear()
        self._incoming.clear()
        self.pool = None        # drop the host memory now, not when the manager is collected

    # -- copies (worker thread) -----------------------------------------------------------

    def _copy_out(self, device_blocks: list[int], host_blocks: list[int],
                  num_tokens: int | None) -> None:
        if self.pool.int8:      # quantized by the mover: the link carries INT8
            buf = self._staging_bytes(len(device_blocks))
            self.mover.export_blocks_int8(device_blocks, num_tokens, out=buf)
            self.pool.store.write_packed(host_blocks, buf)
            return
        view = self.pool.store.run_view(host_blocks)
        if view is not None:
            self.mover.export_blocks(device_blocks, out=view)
            return
        staged = self.mover.export_blocks(device_blocks, out=self._staging(len(device_blocks)))
        self.pool.store.write(host_blocks, staged, num_tokens)

    def _copy_in(self, host_blocks: list[int], device_blocks: list[int]) -> None:
        if self.pool.int8:
            buf = self.pool.store.read_packed(host_blocks,
                                              self._staging_bytes(len(host_blocks)))
            self.mover.import_blocks_int8(device_blocks, buf)
            return
        data = self.pool.store.run_view(host_blocks)
        if data is None:
            data = self.pool.store.read(host_blocks, out=self._staging(len(host_blocks)))
        self.mover.import_blocks(device_blocks, data)

    def _staging_bytes(self, num_blocks: int) -> torch.Tensor:
        staging = getattr(self.mover, "staging", self.copier.staging)
        return staging((self.pool.store.packed_nbytes(num_blocks),), torch.uint8)

    def _staging(self, num_blocks: int) -> torch.Tensor:
        # A mover that offers its own staging (a remote executor's shared memory) saves a copy.
        staging = getattr(self.mover, "staging", self.copier.staging)
        return staging(self.layout.shape(num_blocks), self.layout.dtype)

    # -- bookkeeping (caller thread) ------------------------------------------------------

    def _enter(self) -> None:
        self._check_open()
        self._reap()

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("the KV manager is closed")

    def _reap(self) -> None:
        for swap in [*self._held.values(), *self._incoming.values()]:
            self._reap_out(swap)
        for swap in [s for s in self._incoming.values() if s.into.done()]:
            self._reap_in(swap)

    def _reap_out(self, swap: _Swap) -> None:
        if swap.counted or not swap.out.done():
            return
        error = swap.out.exception()
        if error is None:
            self._count_out(swap)
        elif self._held.get(swap.request_id) is swap:
            self._drop(swap, error)
        # An incoming swap whose swap-out failed is settled with its swap-in.

    def _reap_in(self, swap: _Swap) -> None:
        rid = swap.request_id
        del self._incoming[rid]
        if swap.into.exception() is None:
            self._bytes_in += self._device_bytes(swap)
            self._link_in += self._link_bytes(swap)
            self.pool.allocator.release(rid)
        elif swap.out.exception() is not None:
            self._drop(swap, swap.out.exception())
        else:
            swap.into = None            # the host copy is intact: retry or free
            self._held[rid] = swap

    def _drop(self, swap: _Swap, error: BaseException) -> None:
        self._held.pop(swap.request_id, None)
        self.pool.allocator.release(swap.request_id)
        self._failed_out[swap.request_id] = error

    def _count_out(self, swap: _Swap) -> None:
        if not swap.counted:
            swap.counted = True
            self._bytes_out += self._device_bytes(swap)
            self._link_out += self._link_bytes(swap)

    def _link_bytes(self, swap: _Swap) -> int:
        # INT8 crosses the link packed, exactly as the host pool keeps it.
        per_block = self.pool.block_bytes if self.pool.int8 else self.layout.device_block_bytes
        return len(swap.host_blocks) * per_block

    def _device_bytes(self, swap: _Swap) -> int:
        return len(swap.host_blocks) * self.layout.device_block_bytes

    def _settle_incoming(self, request_id: str) -> None:
        """A new swap-out reads the blocks the request's swap-in may still be writing."""
        swap = self._incoming.get(request_id)
        if swap is not None:
            wait([swap.into])
            self._reap()

    def _why_not_held(self, request_id: str) -> str:
        if request_id in self._incoming:
            return "its swap-in is already in flight"
        if request_id in self._failed_out:
            return f"its swap-out failed ({self._failed_out[request_id]!r})"
        return "it was never swapped out, or was swapped in or freed since"

    def _check_num_tokens(self, num_tokens: int | None, num_blocks: int) -> None:
        if num_tokens is None:
            return
        size = self.layout.block_size
        if (isinstance(num_tokens, bool) or not isinstance(num_tokens, int)
                or not (num_blocks - 1) * size < num_tokens <= num_blocks * size):
            raise InvalidRequestError(
                f"num_tokens {num_tokens!r} does not fit {num_blocks} blocks of {size} tokens "
                f"(the last block must hold at least one)", field="num_tokens")

    def _device_ids(self, device_blocks: list[int]) -> list[int]:
        blocks = list(device_blocks)
        if not blocks:
            raise InvalidRequestError("a swap needs at least one device block",
                                      field="device_blocks")
        bad = [b for b in blocks if not _is_block_id(b, self.num_gpu_blocks)]
        if bad:
            raise InvalidRequestError(f"unknown device block id(s) {bad[:8]}: the device has "
                                      f"blocks 0..{self.num_gpu_blocks - 1}", field="device_blocks")
        if len(set(blocks)) != len(blocks):
            raise InvalidRequestError("device block ids repeat", field="device_blocks")
        return [operator.index(b) for b in blocks]


def _is_block_id(value, num_blocks: int) -> bool:
    if isinstance(value, bool):
        return False
    try:
        return 0 <= operator.index(value) < num_blocks
    except TypeError:
        return False
