"""Runs swap copies off the caller's thread so that they overlap the iteration running meanwhile.

A copy is a plain function run by a worker thread; with one worker, copies run in submission
order. On CUDA each copy runs on a side stream: it first waits for an event recorded on the
caller's stream at submission (so it reads KV the queued iterations have written), and the
worker blocks on an event after it, so a finished future means the bytes have landed.
"""
from __future__ import annotations

import math
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import torch

from services.hardware import keep_torch_single_threaded
from services.kvmanager.interface import SwapHandle


class FutureHandle(SwapHandle):
    def __init__(self, future: Future):
        self._future = future

    @property
    def future(self) -> Future:
        return self._future

    def done(self) -> bool:
        return self._future.done()

    def wait(self) -> None:
        self._future.result()


class Copier:
    def __init__(self, num_workers: int, device: torch.device, pin: bool):
        # Copies stay on their own threads: an OpenMP team per copy thread would slow the
        # forward of an executor in this process (services.hardware).
        self._pool = ThreadPoolExecutor(num_workers, thread_name_prefix="kv-swap",
                                        initializer=keep_torch_single_threaded)
        self._device = device
        self._stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self._pin = pin
        self._local = threading.local()

    @property
    def on_side_stream(self) -> bool:
        """Copies run on a CUDA side stream (beside the compute); on a CPU they share its cores."""
        return self._stream is not None

    def submit(self, fn: Callable[[], None], after: Future | None = None) -> Future:
        """Run ``fn`` once ``after`` (an earlier copy of the same blocks) has finished; if
        that one failed, this one fails with its error: the data it needs never arrived."""
        ready = (None if self._stream is None
                 else torch.cuda.current_stream(self._device).record_event())
        return self._pool.submit(self._run, fn, after, ready)

    def _run(self, fn: Callable[[], None], after: Future | None, ready) -> None:
        if after is not None:
            after.result()
        if self._stream is None:
            fn()
            return
        with torch.cuda.stream(self._stream):
            self._stream.wait_event(ready)
            fn()
            done = self._stream.record_event()
        done.synchronize()

    def staging(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """This worker's reusable host buffer, grown but never shrunk (swaps repeat similar
        sizes, and allocating pinned memory per copy is slow)."""
        numel = math.prod(shape)
        buf = getattr(self._local, "buf", None)
        if buf is None or buf.dtype != dtype or buf.numel() < numel:
            buf = torch.empty(numel, dtype=dtype, pin_memory=self._pin)
            self._local.buf = buf
        return buf[:numel].view(shape)

    def shutdown(self) -> None:
        self._pool.shutdown(wait=True)
