"""Clients of the scheduler service, shaped like ``AsyncEngine`` so that a front written
against the in-process engine (the REST gateway) runs unchanged over gRPC:

    async with AsyncClient("127.0.0.1:50051") as client:
        async for out in client.generate("Hello", SamplingParams(max_tokens=8)):
            print(out.outputs[0].text, end="")

``generate`` yields ``RequestOutput`` deltas (new token ids and text; with ``n > 1`` each
carries one choice, named by its ``index``, and ``finished`` comes on the last), raises
``InvalidRequestError`` for a refused request, and aborts the request when the caller stops
iterating early. ``UNAVAILABLE`` is retried (with backoff) until the stream has produced its
first output; after that a lost stream is the caller's to handle.

``AsyncClient(..., multiplex=True)`` (what the REST gateway uses) carries all its requests on
one ``Subscribe`` stream, each iteration's chunks of all of them in one message, and sends each
request with a unary ``Submit``: one gRPC message per iteration instead of one per running
request, on both sides. Its requests see the same outputs and errors; a deadline is enforced
by the client (the request is aborted and ``DEADLINE_EXCEEDED`` raised), and a lost
subscription ends every request on it with the stream's error."""
from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from collections.abc import AsyncIterator, Iterator

import grpc

from lenserve_contract.errors import InvalidRequestError
from lenserve_contract.outputs import CompletionOutput, RequestMetrics, RequestOutput
from lenserve_contract.proto import scheduler_pb2, scheduler_pb2_grpc
from lenserve_contract.sampling_params import SamplingParams
from services import rpc
from services.scheduler import convert
from services.scheduler.scheduler import SchedulerStats


class _Stream:
    """Turns a stream's chunks into RequestOutputs with client-clock metrics."""

    def __init__(self, prompt: str | None):
        self.prompt = prompt
        self.prompt_token_ids: list[int] = []
        self.metrics = RequestMetrics(arrival_time=time.monotonic())
        self.finished = False

    def output(self, chunk) -> RequestOutput:
        if chunk.prompt_token_ids:
            self.prompt_token_ids = list(chunk.prompt_token_ids)
        now, m = time.monotonic(), self.metrics
        if chunk.token_ids:
            m.first_token_time = m.first_token_time or now
            m.token_times.append(now)
        if chunk.finished:
            m.finished_time = now
        if chunk.prediction_source:
            m.prediction_source = convert.source_from_pb(chunk.prediction_source)
            m.predicted_output_len = chunk.predicted_output_len or None
        self.finished = chunk.finished
        return convert.output_from_chunk(chunk, self.prompt, self.prompt_token_ids, m)


class _Base:
    def __init__(self, target: str, *, timeout_s: float | None = None, retries: int = 3,
                 backoff_s: float = 0.2):
        self.target = rpc.strip_scheme(target)
        self.timeout_s = timeout_s          # default deadline of a generate stream (None: none)
        self.call_timeout_s = 30.0          # abort, stats
        self.retries = retries
        self.backoff_s = backoff_s

    def _request(self, prompt, sampling_params, request_id, prompt_token_ids, kwargs):
        request_id = request_id or f"req-{uuid.uuid4().hex}"
        return convert.request_to_pb(request_id, prompt, sampling_params, prompt_token_ids,
                                     **kwargs)

    def _retryable(self, err: grpc.RpcError, attempt: int) -> bool:
        return err.code() == grpc.StatusCode.UNAVAILABLE and attempt < self.retries

    def _delay(self, attempt: int) -> float:
        return self.backoff_s * 2 ** attempt


def _translate(err: grpc.RpcError) -> Exception:
    """INVALID_ARGUMENT becomes the engine's InvalidRequestError; anything else stays."""
    if err.code() != grpc.StatusCode.INVALID_ARGUMENT:
        return err
    field = dict(err.trailing_metadata() or ()).get(rpc.FIELD_METADATA_KEY, "")
    return InvalidRequestError(err.details() or "", field=field)


class AsyncClient(_Base):
    def __init__(self, target: str, *, multiplex: bool = False, **options):
        super().__init__(target, **options)
        self._channel = grpc.aio.insecure_channel(self.target, options=rpc.CHANNEL_OPTIONS)
        self._stub = scheduler_pb2_grpc.SchedulerServiceStub(self._channel)
        self._mux = _Multiplexer(self) if multiplex else None

    async def generate(self, prompt: str | None = None,
                       sampling_params: SamplingParams | None = None,
                       request_id: str | None = None, *, prompt_token_ids: list[int] | None = None,
                       timeout_s: float | None = None,
                       **request_kwargs) -> AsyncIterator[RequestOutput]:
        msg = self._request(prompt, sampling_params, request_id, prompt_token_ids, request_kwargs)
        if self._mux is not None:
            async for out in self._mux.generate(msg, prompt, timeout_s or self.timeout_s):
                yield out
            return
        call, chunk = await self._open(msg, timeout_s or self.timeout_s)
        stream = _Stream(prompt)
        try:
            while chunk is not grpc.aio.EOF:
                yield stream.output(chunk)
                if stream.finished:
                    return
                chunk = await self._read(call)
        finally:
            if not stream.finished:
                call.cancel()   # the server aborts the request

    async def _open(self, msg, timeout_s):
        """Start the stream and read its first chunk, retrying UNAVAILABLE."""
        for attempt in range(self.retries + 1):
            call = self._stub.Generate(msg, timeout=timeout_s)
            try:
                return call, await call.read()
            except grpc.aio.AioRpcError as err:
                if not self._retryable(err, attempt):
                    raise _translate(err) from None
            await asyncio.sleep(self._delay(attempt))
        raise AssertionError("unreachable")

    @staticmethod
    async def _read(call):
        try:
            return await call.read()
        except grpc.aio.AioRpcError as err:
            raise _translate(err) from None

    async def abort(self, request_id: str) -> bool:
        """Abort a request; its stream ends with finish_reason "abort". False if unknown."""
        req = scheduler_pb2.AbortRequest(request_id=request_id)
        return (await self._unary(self._stub.Abort, req)).found

    async def stats(self) -> SchedulerStats:
        return convert.stats_from_pb(await self._unary(self._stub.GetStats,
                                                       scheduler_pb2.StatsRequest()))

    async def _unary(self, method, request):
        for attempt in range(self.retries + 1):
            try:
                return await method(request, timeout=self.call_timeout_s)
            except grpc.aio.AioRpcError as err:
                if not self._retryable(err, attempt):
                    raise _translate(err) from None
            await asyncio.sleep(self._delay(attempt))
        raise AssertionError("unreachable")

    async def close(self) -> None:
        if self._mux is not None:
            await self._mux.close()
        await self._channel.close()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()


class _Multiplexer:
    """One ``Subscribe`` stream of an ``AsyncClient``, opened on first use and again after it is
    lost; a reader task hands each chunk to its request's queue."""

    def __init__(self, client: AsyncClient):
        self.client = client
        self.subscriber_id = ""
        # request id -> its queue and the subscription it was sent on ("" before Submit)
        self.pending: dict[str, tuple[asyncio.Queue, str]] = {}
        self._reader: asyncio.Task | None = None
        self._opening = asyncio.Lock()

    async def generate(self, msg, prompt: str | None,
                       timeout_s: float | None) -> AsyncIterator[RequestOutput]:
        request_id = msg.request_id
        if request_id in self.pending:
            raise InvalidRequestError(f"request_id {request_id!r} is already running",
                                      field="request_id")
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        queue: asyncio.Queue = asyncio.Queue()
        self.pending[request_id] = (queue, "")
        stream = _Stream(prompt)
        try:
            await self._submit(msg, queue, deadline)
            while True:
                remaining = None if deadline is None else deadline - time.monotonic()
                try:
                    item = await asyncio.wait_for(queue.get(), remaining)
                except asyncio.TimeoutError:
                    raise _deadline_exceeded(timeout_s) from None
                if isinstance(item, Exception):
                    raise item
                yield stream.output(item)
                if stream.finished:
                    return
        finally:
            self.pending.pop(request_id, None)
            if not stream.finished and self._reader is not None and not self._reader.done():
                try:
                    await self.client.abort(request_id)
                except grpc.RpcError:
                    pass        # the scheduler is gone: nothing left to abort

    async def _submit(self, msg, queue: asyncio.Queue, deadline: float | None = None) -> None:
        """Submit on the open subscription, opening it (again) first when needed; UNAVAILABLE
        is retried as a stream's open is. The request is marked as sent on the subscription
        before the call, so that a subscription lost during it fails the request rather than
        leaving it waiting; a retry starts from an empty queue on the new one."""
        for attempt in range(self.client.retries + 1):
            try:
                await self._subscribe()
                self.pending[msg.request_id] = (queue, self.subscriber_id)
                while not queue.empty():        # the error of a subscription lost before
                    queue.get_nowait()
                request = scheduler_pb2.SubmitRequest(subscriber_id=self.subscriber_id,
                                                      request=msg)
                # The request's deadline bounds its Submit too: a router may hold it there
                # while no replica is up.
                timeout = self.client.call_timeout_s if deadline is None else \
                    max(0.001, min(self.client.call_timeout_s, deadline - time.monotonic()))
                await self.client._stub.Submit(request, timeout=timeout)
                return
            except grpc.aio.AioRpcError as err:
                unknown = err.code() == grpc.StatusCode.FAILED_PRECONDITION
                if unknown:         # a restarted scheduler that our stream has not yet seen
                    await self.close()
                lost = unknown or err.code() == grpc.StatusCode.UNAVAILABLE
                if not lost or attempt >= self.client.retries:
                    raise _translate(err) from None
            await asyncio.sleep(self.client._delay(attempt))

    async def _subscribe(self) -> None:
        async with self._opening:
            if self._reader is not None and not self._reader.done():
                return
            subscriber_id = f"sub-{uuid.uuid4().hex}"
            call = self.client._stub.Subscribe(
                scheduler_pb2.SubscribeRequest(subscriber_id=subscriber_id))
            await call.read()           # the empty message that says it is open
            self.subscriber_id = subscriber_id
            self._reader = asyncio.get_running_loop().create_task(self._read(call, subscriber_id))

    async def _read(self, call, subscriber_id: str) -> None:
        error: Exception = ConnectionError("the scheduler ended the subscription")
        try:
            while (step := await call.read()) is not grpc.aio.EOF:
                for chunk in step.chunks:
                    if chunk.request_id in self.pending:
                        self.pending[chunk.request_id][0].put_nowait(chunk)
        except grpc.aio.AioRpcError as err:
            error = err
        except asyncio.CancelledError:
            error = ConnectionError("the client closed its subscription")
            raise
        finally:                # every request sent on this subscription ends with its error
            for queue, sent_on in self.pending.values():
                if sent_on == subscriber_id:
                    queue.put_nowait(error)

    async def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            try:
                await self._reader
            except (asyncio.CancelledError, Exception):     # noqa: BLE001 - it is going away
                pass


def _deadline_exceeded(timeout_s: float) -> grpc.aio.AioRpcError:
    """The error a stream whose deadline passed raises, for a request on a subscription."""
    return grpc.aio.AioRpcError(grpc.StatusCode.DEADLINE_EXCEEDED, grpc.aio.Metadata(),
                                grpc.aio.Metadata(), f"no output within {timeout_s:g}s")


class Client(_Base):
    """The same calls for a synchronous caller; ``generate`` returns an iterator."""

    def __init__(self, target: str, **options):
        super().__init__(target, **options)
        self._channel = grpc.insecure_channel(self.target, options=rpc.CHANNEL_OPTIONS)
        self._stub = scheduler_pb2_grpc.SchedulerServiceStub(self._channel)

    def generate(self, prompt: str | None = None, sampling_params: SamplingParams | None = None,
                 request_id: str | None = None, *, prompt_token_ids: list[int] | None = None,
                 timeout_s: float | None = None, **request_kwargs) -> Iterator[RequestOutput]:
        msg = self._request(prompt, sampling_params, request_id, prompt_token_ids, request_kwargs)
        call, chunk = self._open(msg, timeout_s or self.timeout_s)
        stream = _Stream(prompt)
        try:
            while chunk is not None:
                yield stream.output(chunk)
                if stream.finished:
                    return
                chunk = self._next(call)
        finally:
            if not stream.finished:
                call.cancel()

    def _open(self, msg, timeout_s):
        for attempt in range(self.retries + 1):
            call = self._stub.Generate(msg, timeout=timeout_s)
            try:
                return call, next(call)
            except grpc.RpcError as err:
                if not self._retryable(err, attempt):
                    raise _translate(err) from None
            time.sleep(self._delay(attempt))
        raise AssertionError("unreachable")

    @staticmethod
    def _next(call):
        try:
            return next(call, None)
        except grpc.RpcError as err:
            raise _translate(err) from None

    def generate_all(self, prompt: str | None = None,
                     sampling_params: SamplingParams | None = None, **kwargs) -> RequestOutput:
        """Run one request to the end; the deltas joined into one RequestOutput (with
        ``n > 1``, one joined choice per index)."""
        outs = list(self.generate(prompt, sampling_params, **kwargs))
        joined: dict[int, CompletionOutput] = {}
        for o in outs:
            for c in o.outputs:
                if c.index not in joined:
                    joined[c.index] = dataclasses.replace(c, token_ids=[], text="",
                                                          logprobs=None)
                j = joined[c.index]
                j.token_ids += c.token_ids
                j.text += c.text
                j.finish_reason, j.stop_reason = c.finish_reason, c.stop_reason
                if c.logprobs is not None:
                    j.logprobs = (j.logprobs or []) + c.logprobs
        last = outs[-1]
        last.outputs = [joined[i] for i in sorted(joined)]
        return last

    def abort(self, request_id: str) -> bool:
        return self._unary(self._stub.Abort, scheduler_pb2.AbortRequest(request_id=request_id)).found

    def stats(self) -> SchedulerStats:
        return convert.stats_from_pb(self._unary(self._stub.GetStats, scheduler_pb2.StatsRequest()))

    def _unary(self, method, request):
        for attempt in range(self.retries + 1):
            try:
                return method(request, timeout=self.call_timeout_s)
            except grpc.RpcError as err:
                if not self._retryable(err, attempt):
                    raise _translate(err) from None
            time.sleep(self._delay(attempt))
        raise AssertionError("unreachable")

    def close(self) -> None:
        self._channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
