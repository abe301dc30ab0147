"""The KV manager interface. The in-process core and (later) the gRPC client implement it.

The scheduler decides *which* requests swap; the KV manager owns *where* their blocks live on
the host and moves the bytes. A swap is asynchronous: ``swap_out``/``swap_in`` start the copy
and return a handle at once, so the copy overlaps the iteration that runs meanwhile. The
serving core waits on a swap-in's handle before the iteration that reads those blocks, and on a
swap-out's handle before the device blocks it read are handed to anyone else.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass


class HostPoolFullError(RuntimeError):
    """The host pool cannot take a request's blocks. Nothing was reserved or copied; the
    caller keeps the KV on the device or drops it (recompute) instead."""

    def __init__(self, request_id: str, num_blocks: int, num_free: int):
        super().__init__(f"host KV pool full: request {request_id!r} needs {num_blocks} host "
                         f"blocks, {num_free} free")
        self.request_id, self.num_blocks, self.num_free = request_id, num_blocks, num_free


class RequestNotHeldError(KeyError):
    """``swap_in`` of a request whose KV is not in the host pool; ``reason`` says why."""

    def __init__(self, request_id: str, reason: str):
        super().__init__(request_id)
        self.request_id, self.reason = request_id, reason

    def __str__(self) -> str:   # KeyError would print the repr of its one argument
        return f"request {self.request_id!r} has no KV in the host pool: {self.reason}"


class SwapHandle(ABC):
    """Completion handle of one asynchronous copy."""

    @abstractmethod
    def done(self) -> bool:
        """True once the copy has finished (successfully or not)."""

    @abstractmethod
    def wait(self) -> None:
        """Block until the copy has finished; re-raise its error if it failed."""


@dataclass(frozen=True)
class KVStats:
    num_host_blocks: int
    num_free_host_blocks: int
    host_bytes_used: int
    int8: bool
    num_swapped_requests: int   # requests owning host blocks (held, or swap-in in flight)
    bytes_swapped_out: int      # cumulative device -> host bytes (before compression)
    bytes_swapped_in: int       # cumulative host -> device bytes (after decompression)
    # Bytes that crossed the host link (the packed INT8 form with int8: quantized on the
    # device before the copy out, dequantized there after the copy in).
    link_bytes_out: int = 0
    link_bytes_in: int = 0


class KVManager(ABC):
    """Host KV pool of a fixed number of blocks, block-granular, owned per request."""

    @property
    @abstractmethod
    def num_host_blocks(self) -> int: ...

    @abstractmethod
    def num_free_host_blocks(self) -> int: ...

    @property
    def copies_overlap(self) -> bool:
        """Whether a copy runs beside the iteration without slowing it, as on a GPU's copy
        engine. On a CPU executor the copy's thread takes a core the iteration's matrix products
        need, so a scheduler gains nothing by starting a copy an iteration early."""
        return True

    def can_hold(self, num_blocks: int) -> bool:
        return num_blocks <= self.num_free_host_blocks()

    @abstractmethod
    def holds(self, request_id: str) -> bool:
        """Whether the request has KV in the host pool (swapped out, not yet swapped in)."""

    @abstractmethod
    def swap_out(self, request_id: str, device_blocks: list[int],
                 num_tokens: int | None = None) -> SwapHandle:
        """Reserve host blocks for the request and start copying ``device_blocks`` (in
        position order) to them, compressing to INT8 when enabled. Raises HostPoolFullError
        (nothing reserved) when the pool cannot take them.

        ``num_tokens``: how many tokens of KV the blocks hold (``num_computed_tokens``); the
        slots after them in the last block are stale (another request's KV, or garbage) and
        INT8 scales must not stretch to cover them. None: every slot counts."""

    @abstractmethod
    def swap_in(self, request_id: str, device_blocks: list[int]) -> SwapHandle:
        """Start copying the request's host blocks back into ``device_blocks`` (same count and
        order as swapped out); the host blocks are freed once the copy is done. Raises
        RequestNotHeldError (a KeyError) when the request has no KV in the host pool."""

    def stream_source(self):
        """The host blocks as one tensor ``[num_layers, 2, num_blocks, block_size, Hkv, D]``
        in the device's dtype, which an executor in this process may read and write layer by
        layer (streamed attention, FluidInfer); None where it cannot (INT8 blocks, a remote
        pool). A manager without bytes (the simulator) returns None and streams by its
        bookkeeping alone."""
        return None

    def stream_blocks(self, request_id: str, num_tokens: int) -> list[int]:
        """The host blocks of a held request, grown to hold ``num_tokens`` tokens, once its
        swap-out copy has landed: its attention reads them in place of device blocks. Raises
        RequestNotHeldError, or HostPoolFullError (nothing changed) when it cannot grow."""
        raise NotImplementedError(f"{type(self).__name__} cannot stream KV")

    @abstractmethod
    def free(self, request_id: str) -> None:
        """Drop the request's host copy (finished or aborted while swapped). No-op if none."""

    @abstractmethod
    def wait_all(self) -> None:
        """Block until every started copy has finished."""

    @abstractmethod
    def stats(self) -> KVStats: ...

    @abstractmethod
    def check_integrity(self) -> None:
        """Every host block is free or owned by exactly one request. AssertionError if not."""

    def close(self) -> None:
        """Finish outstanding copies and release host memory."""
