"""An asyncio front for the serving core: ``async for out in engine.generate(...)``.

The step loop runs in one background thread that owns the engine: iterations are CPU/GPU
bound and would otherwise stall the event loop. The event loop only posts commands (add,
abort) to that thread and receives outputs through per-request asyncio queues, so it never
waits on an iteration. ``submit`` sends a request's outputs to a ``StepQueue`` shared by many
requests instead: each iteration puts one list there, of ``(request_id, output or error)``
for every request of that queue the iteration moved (the scheduler service's multiplexed
stream).

Given a config or a builder, the engine is built on that same thread: the thread that runs
the forward passes must be the one that loaded the model, or the process keeps two OpenMP
teams and each iteration slows down (``services.hardware.keep_torch_single_threaded``)."""
from __future__ import annotations

import asyncio
import queue
import threading
import uuid
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future

from lenserve_contract.outputs import RequestOutput
from lenserve_contract.sampling_params import SamplingParams
from services.scheduler.engine_core import EngineCore
from services.scheduler.wiring import EngineConfig, engine_parts


class AsyncEngine:
    """``engine``: an ``EngineConfig``, a callable that builds an ``EngineCore``, or a built
    one. The first two are built on the engine thread (the constructor waits for it and
    raises what the build raised); a built one runs there as it is."""

    def __init__(self, engine: EngineConfig | EngineCore | Callable[[], EngineCore],
                 **engine_kwargs):
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._streams: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self._wake = threading.Event()
        self._stopped = False
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None
        if isinstance(engine, EngineCore):
            self.engine = engine
            return
        if isinstance(engine, EngineConfig):
            config = engine
            engine = lambda: EngineCore(**engine_parts(config), **engine_kwargs)  # noqa: E731
        built: Future = Future()
        self._thread = threading.Thread(target=self._run, args=(engine, built),
                                        name="lenserve-engine", daemon=True)
        self._thread.start()
        try:
            self.engine = built.result()
        except BaseException:
            self._thread.join()
            self._thread = None
            self._stopped = True
            raise

    # -- event-loop side ----------------------------------------------------------------------
    async def generate(self, prompt: str | None = None, sampling_params: SamplingParams | None = None,
                       request_id: str | None = None, *, prompt_token_ids: list[int] | None = None,
                       **request_kwargs) -> AsyncIterator[RequestOutput]:
        """Yield RequestOutput deltas (new token ids and text) until the request finishes.
        Bad input raises InvalidRequestError from the first iteration; closing the iterator
        early aborts the request."""
        request_id = request_id or f"req-{uuid.uuid4().hex}"
        out_queue: asyncio.Queue = asyncio.Queue()
        kwargs = dict(prompt=prompt, prompt_token_ids=prompt_token_ids,
                      sampling_params=sampling_params, delta=True, **request_kwargs)
        await self._call("add", request_id, kwargs, (asyncio.get_running_loop(), out_queue))
        finished = False
        try:
            while not finished:
                item = await out_queue.get()
                if isinstance(item, BaseException):
                    raise item
                finished = item.finished
                yield item
        finally:
            if not finished:
                await self._call("abort", request_id)

    async def submit(self, sink: StepQueue, prompt: str | None = None,
                     sampling_params: SamplingParams | None = None,
                     request_id: str | None = None, *, prompt_token_ids: list[int] | None = None,
                     **request_kwargs) -> str:
        """Add a request whose outputs go to ``sink``; returns its id. Bad input raises
        InvalidRequestError here. The caller aborts it if it stops reading."""
        request_id = request_id or f"req-{uuid.uuid4().hex}"
        kwargs = dict(prompt=prompt, prompt_token_ids=prompt_token_ids,
                      sampling_params=sampling_params, delta=True, **request_kwargs)
        await self._call("add", request_id, kwargs, (asyncio.get_running_loop(), sink))
        return request_id

    async def abort(self, request_id: str) -> bool:
        """Abort a request; its stream ends with finish_reason "abort". False if unknown."""
        return await self._call("abort", request_id)

    async def stats(self):
        return await self._call("stats")

    async def load(self, draining: bool = False):
        """The engine's ``ReplicaLoad`` (what a router places by), read on its thread."""
        return await self._call("load", draining)

    async def _call(self, op: str, *args):
        self._ensure_started()
        future: Future = Future()
        self._commands.put((op, args, future))
        self._wake.set()
        return await asyncio.wrap_future(future)

    def _ensure_started(self) -> None:
        if self._stopped:
            raise RuntimeError("AsyncEngine is shut down")
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="lenserve-engine", daemon=True)
            self._thread.start()

    def shutdown(self) -> None:
        self._stopped = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    # -- engine-thread side -----------------------------------------------------------------
    def _run(self, build: Callable[[], EngineCore] | None = None,
             built: Future | None = None) -> None:
        if build is not None:
            try:
                self.engine = build()
            except BaseException as exc:  # noqa: BLE001 - raised by the constructor
                built.set_exception(exc)
                return
            built.set_result(self.engine)
        engine = self.engine
        while not self._stopped:
            self._drain_commands()
            if not engine.has_unfinished_requests():
                self._wake.wait()
                self._wake.clear()
                continue
            try:
                outputs = engine.step()
            except Exception as exc:  # noqa: BLE001 - an engine bug ends the streams, not silently
                self._fail_all(exc)
                continue
            self._deliver_step(outputs)
        self._fail_all(RuntimeError("AsyncEngine shut down"))

    def _drain_commands(self) -> None:
        while True:
            try:
                op, args, future = self._commands.get_nowait()
            except queue.Empty:
                return
            # A caller cancelled while waiting (a client went away) still gets its command
            # run, an abort above all; only the answer is dropped.
            wanted = future.set_running_or_notify_cancel()
            try:
                result = getattr(self, f"_do_{op}")(*args)
            except Exception as exc:  # noqa: BLE001 - handed back to the caller
                if wanted:
                    future.set_exception(exc)
                continue
            if wanted:
                future.set_result(result)

    def _do_add(self, request_id: str, kwargs: dict, stream) -> None:
        self.engine.add_request(request_id, **kwargs)
        self._streams[request_id] = stream

    def _do_abort(self, request_id: str) -> bool:
        out = self.engine.abort_request(request_id)
        if out is not None:
            self._deliver(request_id, out, final=True)
        return out is not None

    def _do_stats(self):
        return self.engine.stats()

    def _do_load(self, draining: bool):
        from services.scheduler.load import replica_load
        return replica_load(self.engine, draining=draining)

    def _deliver(self, request_id: str, item, final: bool) -> None:
        self._post([(request_id, item, final)])

    def _deliver_step(self, outputs: list[RequestOutput]) -> None:
        self._post([(out.request_id, out, out.finished) for out in outputs])

    def _post(self, items) -> None:
        """Hand ``(request_id, output or exception, final)`` items to their callers' queues,
        with one wake-up per event loop (each ``call_soon_threadsafe`` writes to the loop's
        wake-up pipe: one per request would cost a system call per sequence per iteration on
        the engine thread). A final item ends its stream."""
        by_loop: dict[asyncio.AbstractEventLoop, list] = {}
        for rid, item, final in items:
            stream = self._streams.pop(rid, None) if final else self._streams.get(rid)
            if stream is not None:
                by_loop.setdefault(stream[0], []).append((stream[1], rid, item))
        for loop, queued in by_loop.items():
            try:
                loop.call_soon_threadsafe(_put_all, queued)
            except RuntimeError:    # that caller's event loop is closed: no one reads these
                pass

    def _fail_all(self, exc: BaseException) -> None:
        self.error = exc
        for request_id in list(self._streams):
            self.engine.abort_request(request_id)
            self._deliver(request_id, exc, final=True)


class StepQueue(asyncio.Queue):
    """Receives, per iteration, one list of ``(request_id, RequestOutput or exception)``."""


def _put_all(items: list[tuple[asyncio.Queue, str, object]]) -> None:
    steps: dict[int, tuple[StepQueue, list]] = {}
    for out_queue, request_id, item in items:
        if isinstance(out_queue, StepQueue):
            steps.setdefault(id(out_queue), (out_queue, []))[1].append((request_id, item))
        else:
            out_queue.put_nowait(item)
    for step_queue, batch in steps.values():
        step_queue.put_nowait(batch)
