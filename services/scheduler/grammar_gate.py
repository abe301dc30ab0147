"""Requests with structured output wait outside the scheduler while their grammar compiles.

Compiling a JSON schema for a tokenizer takes tens of milliseconds (xgrammar builds a mask
cache over the vocabulary). Done where it used to be, on the executor's first sampling of the
request, it stalled every request of that iteration. The gate starts the compile when the
request is added, on a worker thread (``Executor.compile_grammar``: in process, or an RPC to
the executor's own compile threads); xgrammar releases the GIL while it compiles, so the
iterations of the other requests go on at their pace. The request joins the scheduler only
when its grammar is in the executor's cache: until then no policy sees it and it holds no KV
block. A schema compiled before (the same kind and text) lets its request in at once. A schema
the executor cannot compile ends the request with finish_reason "error" and the compiler's
message (the gateway refuses with a 400 what it can check without the tokenizer).
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait

from lenserve_contract.errors import InvalidRequestError
from lenserve_contract.sampling_params import StructuredOutput
from services.scheduler.request import Request

MAX_KNOWN = 1024    # schemas whose compile outcome is remembered


class GrammarGate:
    def __init__(self, compile_grammar: Callable[[StructuredOutput], None], workers: int = 2):
        self._compile = compile_grammar
        self._workers = workers
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        # (kind, schema) -> its compile, newest last; failed ones stay (no recompiling a bad
        # schema), ones that failed for an outside reason (the executor down) are dropped.
        self._compiles: OrderedDict[tuple[str, str], Future] = OrderedDict()
        self._held: dict[str, tuple[Request, Future]] = {}
        self._predictions: dict[str, object] = {}   # arrived while their request was held

    def __len__(self) -> int:
        return len(self._held)

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._held

    def add(self, scheduler, request: Request) -> None:
        """Queue ``request`` in ``scheduler`` now, or hold it until its grammar is compiled
        (``release_into``). Refuses (InvalidRequestError) what the scheduler would refuse."""
        so = request.sampling_params.structured_output
        if so is None:
            scheduler.add_request(request)
            return
        if request.request_id in self._held:
            raise InvalidRequestError(f"request id {request.request_id!r} is already in use",
                                      field="request_id")
        scheduler.validate(request)
        future = self._future(so)
        if future.done() and future.exception() is None:
            scheduler.add_request(request)
        else:
            self._held[request.request_id] = (request, future)

    def _future(self, so: StructuredOutput) -> Future:
        key = (so.kind, so.schema)
        with self._lock:
            future = self._compiles.get(key)
            if future is not None:
                self._compiles.move_to_end(key)
                return future
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self._workers, thread_name_prefix="grammar")
            future = self._pool.submit(self._compile, so)
            self._compiles[key] = future
            while len(self._compiles) > MAX_KNOWN:
                self._compiles.popitem(last=False)
        future.add_done_callback(lambda f: self._forget_if_outside(key, f))
        return future

    def _forget_if_outside(self, key: tuple[str, str], future: Future) -> None:
        exc = future.exception()
        if exc is not None and not isinstance(exc, InvalidRequestError):
            with self._lock:
                if self._compiles.get(key) is future:
                    del self._compiles[key]

    def hold_prediction(self, request_id: str, prediction) -> bool:
        """Keep a prediction that arrived for a held request (given to the scheduler when the
        request joins it); False if the request is not held."""
        if request_id not in self._held:
            return False
        self._predictions[request_id] = prediction
        return True

    def release_into(self, scheduler) -> list[tuple[Request, str]]:
        """Queue in ``scheduler`` the held requests whose compile is done; returns those whose
        compile failed, with why (queued too, for the caller to end them)."""
        failed = []
        for rid in [rid for rid, (_, future) in self._held.items() if future.done()]:
            request, future = self._held[rid]
            exc = future.exception()
            self._queue(scheduler, rid)
            if exc is not None:
                failed.append((request, _why(exc)))
        return failed

    def remove_into(self, scheduler, request_id: str) -> bool:
        """Queue a held request now, compiled or not (to abort it); False if not held."""
        if request_id not in self._held:
            return False
        self._queue(scheduler, request_id)
        return True

    def _queue(self, scheduler, request_id: str) -> None:
        request, _ = self._held.pop(request_id)
        scheduler.add_request(request)
        prediction = self._predictions.pop(request_id, None)
        if prediction is not None:
            scheduler.set_prediction(request_id, prediction)

    def wait(self, timeout_s: float) -> None:
        """Block until a held request's compile is done, or ``timeout_s``."""
        futures = {future for _, future in self._held.values()}
        if futures:
            wait(futures, timeout=timeout_s, return_when=FIRST_COMPLETED)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)


def _why(exc: BaseException) -> str:
    if isinstance(exc, InvalidRequestError):
        return str(exc)
    return f"the grammar could not be compiled: {type(exc).__name__}: {exc}"
