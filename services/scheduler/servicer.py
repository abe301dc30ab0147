"""gRPC shell of the scheduler: ``Generate`` streams an ``AsyncEngine``'s output deltas,
``Subscribe`` + ``Submit`` stream many requests' deltas as one message per iteration,
``Link`` does the same on one bidirectional stream (a router's: requests go up as messages,
each answered with its admission), ``Abort`` and ``GetStats`` pass through, plus the standard
health service.

A client that cancels its stream (or whose deadline passes) aborts the request: the
cancellation reaches ``AsyncEngine.generate``, whose clean-up aborts it in the core. A
cancelled subscription aborts every request still running on it."""
from __future__ import annotations

import asyncio
import logging

import grpc

from lenserve_contract.errors import InvalidRequestError
from lenserve_contract.proto import common_pb2, scheduler_pb2, scheduler_pb2_grpc
from services import rpc
from services.scheduler import convert
from services.scheduler.async_engine import AsyncEngine, StepQueue

log = logging.getLogger(__name__)
SERVICE_NAME = "lenserve.proto.SchedulerService"


LOAD_INTERVAL_S = 0.1     # StreamLoad's default: a router's view is this stale at most


class SchedulerServicer(scheduler_pb2_grpc.SchedulerServiceServicer):
    def __init__(self, engine: AsyncEngine):
        self.engine = engine
        self._subscriptions: dict[str, _Subscription] = {}
        # Set when the service stops: load reports say so, and a router places nothing new.
        self.draining = False

    async def Generate(self, request, context):
        try:
            stream = self.engine.generate(**convert.request_from_pb(request))
            counts, first = {}, True
            async for out in stream:
                for chunk in convert.chunks_from_output(out, counts, first):
                    yield chunk
                first = False
        except InvalidRequestError as exc:
            await _abort_invalid(context, str(exc), exc.field)
        except RuntimeError as exc:   # the engine stopped (shutdown or a bug in the loop)
            log.error("request %s failed: %s", request.request_id, exc)
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))

    async def Subscribe(self, request, context):
        sid = request.subscriber_id
        if not sid or sid in self._subscriptions:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"subscriber_id {sid!r} is empty or already subscribed")
        sub = self._subscriptions[sid] = _Subscription()
        try:
            yield scheduler_pb2.StepChunks()          # open: Submit may name it now
            while True:
                yield scheduler_pb2.StepChunks(chunks=sub.chunks(await sub.queue.get()))
        finally:
            del self._subscriptions[sid]
            for request_id in list(sub.counts):       # the client went away
                await self.engine.abort(request_id)

    async def Submit(self, request, context):
        sub = self._subscriptions.get(request.subscriber_id)
        if sub is None:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                f"no subscription {request.subscriber_id!r}: Subscribe first")
        request_id = request.request.request_id
        if not request_id or request_id in sub.counts:
            await _abort_invalid(context, f"request_id {request_id!r} is empty or already "
                                          "running", "request_id")
        sub.counts[request_id] = None
        try:
            await self.engine.submit(sub.queue, **convert.request_from_pb(request.request))
        except InvalidRequestError as exc:
            sub.counts.pop(request_id, None)
            await _abort_invalid(context, str(exc), exc.field)
        except RuntimeError as exc:   # the engine stopped
            sub.counts.pop(request_id, None)
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
        if self._subscriptions.get(request.subscriber_id) is not sub:
            await self.engine.abort(request_id)    # it went away while the request was added
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                f"subscription {request.subscriber_id!r} ended")
        return scheduler_pb2.SubmitResponse()

    async def Link(self, request_iterator, context):
        # At once: the router counts the replica up only once it has seen this.
        await context.send_initial_metadata(())
        link = _Subscription()
        reader = asyncio.ensure_future(self._take(request_iterator, link))
        try:
            while True:
                step = await link.queue.get()
                while not link.queue.empty():           # admissions ride with the chunks
                    step += link.queue.get_nowait()
                bad = next((x for x in step if isinstance(x, rpc.Malformed)), None)
                if bad is not None:
                    await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                        f"malformed request: {bad.error}")
                yield link.reply(step)
        finally:
            reader.cancel()
            for request_id in list(link.counts):       # the router went away
                await self.engine.abort(request_id)

    async def _take(self, request_iterator, link: _Subscription) -> None:
        """Each message starts its own task, in order: the engine takes commands in the order
        they are sent, so a request's abort never overtakes it, and one request's admission
        does not wait for another's."""
        async for msg in request_iterator:
            if isinstance(msg, rpc.Malformed):
                link.queue.put_nowait([msg])
                return
            if msg.HasField("abort"):
                asyncio.ensure_future(self.engine.abort(msg.abort))
            else:
                asyncio.ensure_future(self._admit(link, msg.submit))

    async def _admit(self, link: _Subscription, request) -> None:
        rid = request.request_id
        error = None
        if not rid or rid in link.counts:
            error = common_pb2.ErrorDetail(
                code=common_pb2.ERROR_CODE_INVALID_ARGUMENT, field="request_id",
                message=f"request_id {rid!r} is empty or already running")
        else:
            link.counts[rid] = None
            try:
                await self.engine.submit(link.queue, **convert.request_from_pb(request))
            except InvalidRequestError as exc:
                error = common_pb2.ErrorDetail(code=common_pb2.ERROR_CODE_INVALID_ARGUMENT,
                                               message=str(exc), field=exc.field or "")
            except RuntimeError as exc:   # the engine stopped
                error = common_pb2.ErrorDetail(code=common_pb2.ERROR_CODE_UNAVAILABLE,
                                               message=str(exc))
            if error is not None:
                link.counts.pop(rid, None)
        link.queue.put_nowait([(rid, scheduler_pb2.Admission(request_id=rid, error=error))])

    async def Abort(self, request, context):
        return scheduler_pb2.AbortResponse(found=await self.engine.abort(request.request_id))

    async def GetStats(self, request, context):
        return convert.stats_to_pb(await self.engine.stats())

    async def StreamLoad(self, request, context):
        interval = request.interval_s if request.interval_s > 0 else LOAD_INTERVAL_S
        while True:
            try:
                load = await self.engine.load(self.draining)
            except RuntimeError as exc:       # the engine stopped
                await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
            yield convert.load_to_pb(load)
            await asyncio.sleep(max(interval, 0.01))


async def _abort_invalid(context, message: str, field: str) -> None:
    """INVALID_ARGUMENT, naming the bad field in the trailing metadata for the client."""
    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, message,
                        trailing_metadata=((rpc.FIELD_METADATA_KEY, field),))


class _Subscription:
    """One client's multiplexed stream: its step queue and, per running request, the output
    tokens sent so far per choice (None before its first chunk; a request runs on it from
    Submit to its final chunk)."""

    def __init__(self):
        self.queue = StepQueue()
        self.counts: dict[str, dict[int, int] | None] = {}

    def chunks(self, step: list) -> list:
        chunks = []
        for request_id, item in step:
            counts = self.counts.get(request_id, {})
            if isinstance(item, BaseException):       # the engine stopped
                new = [convert.error_chunk(request_id, str(item))]
            else:
                self.counts[request_id] = sent = counts if counts is not None else {}
                new = convert.chunks_from_output(item, sent, counts is None)
            if new and new[-1].finished:
                self.counts.pop(request_id, None)
            chunks += new
        return chunks

    def reply(self, step: list) -> scheduler_pb2.LinkReply:
        """A ``Link`` message: the admissions among ``step``, and the chunks of the rest."""
        admissions = [item for _, item in step if isinstance(item, scheduler_pb2.Admission)]
        outputs = [x for x in step if not isinstance(x[1], scheduler_pb2.Admission)] \
            if admissions else step
        return scheduler_pb2.LinkReply(chunks=self.chunks(outputs), admissions=admissions)


def build_server(engine: AsyncEngine, address: str) -> tuple[grpc.aio.Server, int]:
    """An unstarted server on address ('127.0.0.1:0' picks a free port)."""
    server, port = rpc.new_server(address, "scheduler")
    servicer = SchedulerServicer(engine)
    rpc.add_service(server, scheduler_pb2_grpc.add_SchedulerServiceServicer_to_server, servicer)
    server.servicer = servicer      # type: ignore[attr-defined] - its draining flag
    return server, port


async def mark_serving(server) -> None:
    await rpc.mark_serving(server, [SERVICE_NAME])
