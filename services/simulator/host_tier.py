"""The simulated host KV tier: the ``KVManager`` interface in virtual time.

It keeps the real manager's bookkeeping (a fixed number of host blocks, owned per request, held
from swap-out to swap-in, incoming while a swap-in runs) and moves no bytes: each copy takes the
link's time for the device bytes of its blocks. Copies run on one lane per direction, in
submission order (a GPU's copy engines, each side of a full-duplex link), concurrently with
the iterations: a handle is done once the virtual clock has passed its copy's end, and waiting
on it moves the clock there. The serving core waits on a swap-in before the iteration that
reads it and on a swap-out after the iteration it overlapped, exactly as with the real manager,
so a copy that outlasts its iteration stalls the simulated engine by the difference.

INT8 (``--kv-int8``) changes what the host pool holds and what crosses the link: the executor
quantizes a request's blocks on the device before the copy out and dequantizes them there after
the copy in, so a copy moves the packed INT8 bytes (the real pool's block size, scales
included) and takes the codec's time on the device besides (``HostLink.int8_codec_bytes_per_s``,
device bytes per second; not charged when a link leaves it unset).
"""
from __future__ import annotations

from dataclasses import dataclass

from services.executor.types import ModelInfo
from services.kvmanager.config import KVManagerConfig
from services.kvmanager.interface import (
    HostPoolFullError,
    KVManager,
    KVStats,
    RequestNotHeldError,
    SwapHandle,
)


@dataclass(frozen=True)
class HostLink:
    """The time of one copy between device and host: ``latency_s + bytes / bandwidth``."""
    out_bytes_per_s: float      # device -> host
    in_bytes_per_s: float       # host -> device
    latency_s: float            # per copy (one request's blocks)
    source: str                 # where the figures come from, estimates named as such
    # Copies run beside the iteration (a GPU's copy engines); False for a CPU executor, whose
    # copies take the cores its iterations use (what the real KV manager reports there).
    overlaps_compute: bool = True
    # Device bytes per second the executor quantizes (and dequantizes) INT8 KV at.
    int8_codec_bytes_per_s: float | None = None
    # KV bytes per second the host CPU attends over in place (lenserve's paged C++ kernel on
    # the host's cores, bounded by its memory bandwidth): streamed waves' attention in the
    # CPU mode (``stream_mode=cpu``). None: not modelled for this target.
    host_attention_bytes_per_s: float | None = None

    def __post_init__(self):
        if not (self.out_bytes_per_s > 0 and self.in_bytes_per_s > 0 and self.latency_s >= 0):
            raise ValueError(f"a host link needs positive bandwidths and a latency >= 0, got "
                             f"{self.out_bytes_per_s}, {self.in_bytes_per_s}, {self.latency_s}")

    def seconds(self, num_bytes: int, out: bool) -> float:
        return self.latency_s + num_bytes / (self.out_bytes_per_s if out else self.in_bytes_per_s)

    def describe(self) -> str:
        return (f"host link: {self.out_bytes_per_s / 1e9:.2f} GB/s out, "
                f"{self.in_bytes_per_s / 1e9:.2f} GB/s in, {self.latency_s * 1e6:.0f} us per "
                f"copy ({self.source})")


class _Owned(dict):
    """Host blocks per owner, with their total kept as it changes (the prefix cache's host
    tier makes thousands of one-block owners: summing them per call was quadratic)."""

    total = 0

    def __setitem__(self, owner: str, n: int) -> None:
        self.total += n - self.get(owner, 0)
        super().__setitem__(owner, n)

    def __delitem__(self, owner: str) -> None:
        self.total -= self[owner]
        super().__delitem__(owner)


class _VirtualHandle(SwapHandle):
    def __init__(self, clock, end: float):
        self._clock, self.end = clock, end

    def done(self) -> bool:
        return self._clock.now >= self.end

    def wait(self) -> None:
        self._clock.advance_to(self.end)


class SimKVManager(KVManager):
    def __init__(self, config: KVManagerConfig, info: ModelInfo, link: HostLink, clock):
        # The real pool's block sizes (their layout is torch's): imported only when a host
        # tier is simulated, so a simulation without one never loads torch.
        from services.kvmanager.host_pool import host_block_bytes
        from services.kvmanager.host_store import BlockLayout

        layout = BlockLayout.from_model_info(info)
        self.link, self.clock = link, clock
        self.int8 = config.int8
        self.block_bytes = host_block_bytes(layout, config.int8)
        self.device_block_bytes = layout.device_block_bytes
        # What one block puts on the link: the packed INT8 block, or the device's bytes.
        self.link_block_bytes = self.block_bytes if config.int8 else self.device_block_bytes
        self._link = {True: 0, False: 0}           # bytes put on the link per direction
        self._num_blocks = config.swap_space_bytes // self.block_bytes
        self.num_gpu_blocks = info.num_gpu_blocks
        self.block_size = info.block_size
        self._owned = _Owned()                      # request -> host blocks
        self._streamed: set[str] = set()            # held requests that have streamed
        self._out_end: dict[str, float] = {}        # held: when its swap-out copy ends
        self._in_end: dict[str, float] = {}         # incoming: when its swap-in copy ends
        self._lane = {True: 0.0, False: 0.0}        # each direction's copies end by then
        self._bytes_out = self._bytes_in = 0
        self._closed = False

    @property
    def num_host_blocks(self) -> int:
        return self._num_blocks

    @property
    def copies_overlap(self) -> bool:
        return self.link.overlaps_compute

    def num_free_host_blocks(self) -> int:
        self._reap()
        return self._num_blocks - self._owned.total

    def holds(self, request_id: str) -> bool:
        self._reap()
        return request_id in self._out_end

    def swap_out(self, request_id: str, device_blocks: list[int],
                 num_tokens: int | None = None) -> SwapHandle:
        self._reap()
        n = self._check_blocks(device_blocks)
        if request_id in self._out_end:
            raise ValueError(f"request {request_id!r} is already swapped out")
        if request_id in self._in_end:      # its swap-in must land before it is read again
            self.clock.advance_to(self._in_end.pop(request_id))
            del self._owned[request_id]
        free = self._num_blocks - self._owned.total
        if n > free:
            raise HostPoolFullError(request_id, n, free)
        self._owned[request_id] = n
        end = self._copy(n, out=True)
        self._out_end[request_id] = end
        self._bytes_out += n * self.device_block_bytes
        return _VirtualHandle(self.clock, end)

    def swap_in(self, request_id: str, device_blocks: list[int]) -> SwapHandle:
        self._reap()
        n = self._check_blocks(device_blocks)
        if request_id not in self._out_end:
            why = ("its swap-in is already in flight" if request_id in self._in_end
                   else "it was never swapped out, or was swapped in or freed since")
            raise RequestNotHeldError(request_id, why)
        if request_id in self._streamed and n < self._owned[request_id]:
            self._owned[request_id] = n     # grown for a streamed iteration that did not run
        if n != self._owned[request_id]:
            raise ValueError(f"request {request_id!r} was swapped out from "
                             f"{self._owned[request_id]} blocks, cannot swap in to {n}")
        self._streamed.discard(request_id)
        end = self._copy(n, out=False, after=self._out_end.pop(request_id))
        self._in_end[request_id] = end
        self._bytes_in += n * self.device_block_bytes
        return _VirtualHandle(self.clock, end)

    @property
    def stream_link_bytes_per_s(self) -> float:
        return self.link.in_bytes_per_s if self.link.overlaps_compute else 0.0

    def stream_source(self):
        """No bytes to expose: streaming is bookkeeping here, its copies the executor's cost."""
        return "simulated"

    def stream_blocks(self, request_id: str, num_tokens: int) -> list[int]:
        """Bookkeeping only: waits for the request's swap-out and grows its host blocks; the
        per-layer stream of its KV is charged by the executor's cost (``stream_s``)."""
        self._reap()
        if request_id not in self._out_end:
            raise RequestNotHeldError(request_id, "it is not held in the host tier")
        self.clock.advance_to(self._out_end[request_id])
        need = -(-num_tokens // self.block_size)
        more = need - self._owned[request_id]
        free = self._num_blocks - self._owned.total
        if more > free:
            raise HostPoolFullError(request_id, more, free)
        self._owned[request_id] = need
        self._streamed.add(request_id)
        return list(range(self._owned[request_id]))

    def free(self, request_id: str) -> None:
        self._reap()
        self._streamed.discard(request_id)
        if request_id in self._out_end:
            del self._out_end[request_id]
            del self._owned[request_id]

    def wait_all(self) -> None:
        self.clock.advance_to(max(self._lane.values()))
        self._reap()

    def stats(self) -> KVStats:
        self._reap()
        used = self._owned.total
        return KVStats(num_host_blocks=self._num_blocks,
                       num_free_host_blocks=self._num_blocks - used,
                       host_bytes_used=used * self.block_bytes, int8=self.int8,
                       num_swapped_requests=len(self._owned),
                       bytes_swapped_out=self._bytes_out, bytes_swapped_in=self._bytes_in,
                       link_bytes_out=self._link[True], link_bytes_in=self._link[False])

    def check_integrity(self) -> None:
        assert not set(self._out_end) & set(self._in_end), "a request is held and incoming"
        assert set(self._owned) == set(self._out_end) | set(self._in_end), "owners != swaps"
        assert self._owned.total <= self._num_blocks, "more host blocks owned than exist"

    def close(self) -> None:
        self._closed = True

    def _copy(self, num_blocks: int, out: bool, after: float = 0.0) -> float:
        self._link[out] += num_blocks * self.link_block_bytes
        seconds = self.link.seconds(num_blocks * self.link_block_bytes, out)
        codec = self.link.int8_codec_bytes_per_s
        if self.int8 and codec:
            seconds += num_blocks * self.device_block_bytes / codec
        start = max(self.clock.now, self._lane[out], after)
        self._lane[out] = start + seconds
        return start + seconds

    def _reap(self) -> None:
        if self._closed:
            raise RuntimeError("the KV manager is closed")
        now = self.clock.now
        for rid in [r for r, end in self._in_end.items() if end <= now]:
            del self._in_end[rid]
            del self._owned[rid]

    def _check_blocks(self, device_blocks: list[int]) -> int:
        blocks = list(device_blocks)
        if not blocks or len(set(blocks)) != len(blocks) or not all(
                0 <= b < self.num_gpu_blocks for b in blocks):
            raise ValueError(f"bad device blocks {blocks[:8]} for a pool of "
                             f"{self.num_gpu_blocks}")
        return len(blocks)
