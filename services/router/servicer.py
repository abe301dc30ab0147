"""The router's gRPC shell: the scheduler's own contract (``SchedulerService``), so the gateway
and the SDK talk to a router as to one scheduler. ``Generate`` and ``Subscribe``/``Submit``
place each request (``Router.start``) and relay the replica's chunks as they arrive;
``Link`` does the same for a router in front of this one;
``Abort`` goes to the replica that runs the request; ``GetStats`` and ``StreamLoad`` answer
for the replicas that are up, summed."""
from __future__ import annotations

import asyncio
import dataclasses
import time

import grpc

from lenserve_contract.proto import common_pb2, scheduler_pb2, scheduler_pb2_grpc
from services import rpc
from services.router.core import NoReplica
from services.router.runtime import Refused, Router
from services.scheduler import convert
from services.scheduler.load import ReplicaLoad
from services.scheduler.scheduler import SchedulerStats
from services.scheduler.servicer import SERVICE_NAME

_SUMMED = [f.name for f in dataclasses.fields(SchedulerStats) if f.name != "policy"]


class RouterServicer(scheduler_pb2_grpc.SchedulerServiceServicer):
    def __init__(self, router: Router):
        self.router = router
        self._subscriptions: dict[str, asyncio.Queue] = {}

    async def Generate(self, request, context):
        queue: asyncio.Queue = asyncio.Queue()
        remaining = context.time_remaining()
        deadline = None if remaining is None else time.monotonic() + remaining
        await self._start(request, queue, deadline, context)
        finished = False
        try:
            while not finished:
                chunks = await queue.get()
                if isinstance(chunks, Exception):   # refused by the replica
                    finished = True
                    await _abort(context, chunks)
                for chunk in chunks:
                    finished = finished or chunk.finished
                    yield chunk
        finally:
            if not finished:        # the client went away: the replica stops the request
                self.router.abort(request.request_id, notify=False)

    async def Subscribe(self, request, context):
        sid = request.subscriber_id
        if not sid or sid in self._subscriptions:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"subscriber_id {sid!r} is empty or already subscribed")
        queue = self._subscriptions[sid] = asyncio.Queue()
        running: set[str] = set()
        queue.running = running     # type: ignore[attr-defined]
        try:
            yield scheduler_pb2.StepChunks()
            while True:
                chunks = await queue.get()
                for chunk in chunks:
                    if chunk.finished:
                        running.discard(chunk.request_id)
                yield scheduler_pb2.StepChunks(chunks=chunks)
        finally:
            del self._subscriptions[sid]
            for request_id in list(running):
                self.router.abort(request_id, notify=False)

    async def Submit(self, request, context):
        queue = self._subscriptions.get(request.subscriber_id)
        if queue is None:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                f"no subscription {request.subscriber_id!r}: Subscribe first")
        rid = request.request.request_id
        remaining = context.time_remaining()
        # The Submit call's deadline bounds its placement, not the request: a multiplexed
        # client enforces the request's own deadline and aborts it.
        place_by = None if remaining is None else time.monotonic() + remaining
        queue.running.add(rid)
        try:
            await self._start(request.request, queue, None, context, place_by, admitted=True)
        except BaseException:
            queue.running.discard(rid)
            raise
        return scheduler_pb2.SubmitResponse()

    async def Link(self, request_iterator, context):
        """A replica's link, served by placing each request (a router in front of routers)."""
        await context.send_initial_metadata(())     # the router waits for it
        queue: asyncio.Queue = asyncio.Queue()      # chunk lists, Admissions, or Malformed
        running: set[str] = set()
        reader = asyncio.ensure_future(self._take(request_iterator, queue, running))
        try:
            while True:
                items = [await queue.get()]
                while not queue.empty():
                    items.append(queue.get_nowait())
                reply = scheduler_pb2.LinkReply()
                for item in items:
                    if isinstance(item, rpc.Malformed):
                        await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                            f"malformed request: {item.error}")
                    elif isinstance(item, scheduler_pb2.Admission):
                        reply.admissions.append(item)
                    else:
                        running.difference_update(c.request_id for c in item if c.finished)
                        reply.chunks.extend(item)
                yield reply
        finally:
            reader.cancel()
            for request_id in list(running):
                self.router.abort(request_id, notify=False)

    async def _take(self, request_iterator, queue: asyncio.Queue, running: set[str]) -> None:
        async for msg in request_iterator:
            if isinstance(msg, rpc.Malformed):
                queue.put_nowait(msg)
                return
            if msg.HasField("abort"):
                self.router.abort(msg.abort)
            else:
                running.add(msg.submit.request_id)
                asyncio.ensure_future(self._admit(msg.submit, queue, running))

    async def _admit(self, request, queue: asyncio.Queue, running: set[str]) -> None:
        error = None
        try:
            await self.router.start(request, queue, None, None, admitted=True)
        except (Refused, ValueError) as exc:
            error = common_pb2.ErrorDetail(code=common_pb2.ERROR_CODE_INVALID_ARGUMENT,
                                           message=str(exc), field=getattr(exc, "field", ""))
        except NoReplica as exc:
            error = common_pb2.ErrorDetail(code=common_pb2.ERROR_CODE_UNAVAILABLE,
                                           message=str(exc))
        if error is not None:
            running.discard(request.request_id)
        queue.put_nowait(scheduler_pb2.Admission(request_id=request.request_id, error=error))

    async def _start(self, request, queue, deadline, context, place_by=None,
                     admitted=False) -> None:
        try:
            await self.router.start(request, queue, deadline, place_by, admitted)
        except Refused as exc:
            await _abort(context, exc)
        except ValueError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc),
                                trailing_metadata=((rpc.FIELD_METADATA_KEY, "request_id"),))
        except NoReplica as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))

    async def Abort(self, request, context):
        return scheduler_pb2.AbortResponse(found=self.router.abort(request.request_id))

    async def GetStats(self, request, context):
        return convert.stats_to_pb(summed_stats(self.router.core.policy.name,
                                                self._loads()))

    async def StreamLoad(self, request, context):
        interval = request.interval_s if request.interval_s > 0 else 0.1
        while True:
            loads = self._loads()
            stats = summed_stats(self.router.core.policy.name, loads)
            yield convert.load_to_pb(ReplicaLoad(
                stats, loads[0].block_size if loads else 0,
                sum(x.queued_prefill_tokens for x in loads),
                sum(x.remaining_decode_tokens for x in loads),
                sum(x.num_unpredicted for x in loads)))
            await asyncio.sleep(max(interval, 0.01))

    def _loads(self) -> list[ReplicaLoad]:
        return [r.load for r in self.router.core.up_replicas() if r.load is not None]


async def _abort(context, exc: Exception) -> None:
    """End the call with a refusal's status (or a request the router could not place)."""
    if isinstance(exc, Refused):
        await context.abort(exc.code, exc.message, trailing_metadata=(
            ((rpc.FIELD_METADATA_KEY, exc.field),) if exc.field else ()))
    await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))


def summed_stats(policy: str, loads: list[ReplicaLoad]) -> SchedulerStats:
    """The replicas' stats added up (counts and blocks), under the router's policy name."""
    return SchedulerStats(policy=f"router:{policy}",
                          **{name: sum(getattr(x.stats, name) for x in loads)
                             for name in _SUMMED})


def build_server(router: Router, address: str) -> tuple[grpc.aio.Server, int]:
    server, port = rpc.new_server(address, "router")
    rpc.add_service(server, scheduler_pb2_grpc.add_SchedulerServiceServicer_to_server,
                    RouterServicer(router))
    return server, port


async def mark_serving(server) -> None:
    await rpc.mark_serving(server, [SERVICE_NAME])
