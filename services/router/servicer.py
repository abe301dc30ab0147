"""The router's gRPC shell: the scheduler's own contract (``SchedulerService``), so the gateway
and the SDK talk to a router as to one scheduler. ``Generate`` and ``Subscribe``/``Submit``
place each request (``Router.start``) and relay the replica's chunks as they arrive;
``Abort`` goes to the replica that runs the request; ``GetStats`` and ``StreamLoad`` answer
for the replicas that are up, summed."""
from __future__ import annotations

import asyncio
import dataclasses
import time

import grpc

from lenserve_contract.proto import scheduler_pb2, scheduler_pb2_grpc
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
                for chunk in await queue.get():
                    finished = finished or chunk.finished
                    yield chunk
        finally:
            if not finished:        # the client went away: the replica stops the request
                await self.router.abort(request.request_id)

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
                await self.router.abort(request_id)

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
            await self._start(request.request, queue, None, context, place_by)
        except BaseException:
            queue.running.discard(rid)
            raise
        return scheduler_pb2.SubmitResponse()

    async def _start(self, request, queue, deadline, context, place_by=None) -> None:
        try:
            await self.router.start(request, queue, deadline, place_by)
        except Refused as exc:
            await context.abort(exc.err.code(), exc.err.details() or "",
                                trailing_metadata=tuple(exc.err.trailing_metadata() or ()))
        except ValueError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc),
                                trailing_metadata=((rpc.FIELD_METADATA_KEY, "request_id"),))
        except NoReplica as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))

    async def Abort(self, request, context):
        return scheduler_pb2.AbortResponse(found=await self.router.abort(request.request_id))

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
