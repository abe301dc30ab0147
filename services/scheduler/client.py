"""Clients of the scheduler service, shaped like ``AsyncEngine`` so that a front written
against the in-process engine (the REST gateway) runs unchanged over gRPC:

    async with AsyncClient("127.0.0.1:50051") as client:
        async for out in client.generate("Hello", SamplingParams(max_tokens=8)):
            print(out.outputs[0].text, end="")

``generate`` yields ``RequestOutput`` deltas (new token ids and text), raises
``InvalidRequestError`` for a refused request, and aborts the request when the caller stops
iterating early. ``UNAVAILABLE`` is retried (with backoff) until the stream has produced its
first output; after that a lost stream is the caller's to handle."""
from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Iterator

import grpc

from lenserve_contract.errors import InvalidRequestError
from lenserve_contract.outputs import RequestMetrics, RequestOutput
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
    def __init__(self, target: str, **options):
        super().__init__(target, **options)
        self._channel = grpc.aio.insecure_channel(self.target, options=rpc.CHANNEL_OPTIONS)
        self._stub = scheduler_pb2_grpc.SchedulerServiceStub(self._channel)

    async def generate(self, prompt: str | None = None,
                       sampling_params: SamplingParams | None = None,
                       request_id: str | None = None, *, prompt_token_ids: list[int] | None = None,
                       timeout_s: float | None = None,
                       **request_kwargs) -> AsyncIterator[RequestOutput]:
        msg = self._request(prompt, sampling_params, request_id, prompt_token_ids, request_kwargs)
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
        await self._channel.close()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()


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
        """Run one request to the end; the deltas joined into one RequestOutput."""
        outs = list(self.generate(prompt, sampling_params, **kwargs))
        last = outs[-1]
        last.outputs[0].token_ids = [t for o in outs for t in o.outputs[0].token_ids]
        last.outputs[0].text = "".join(o.outputs[0].text for o in outs)
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
