"""gRPC shell of the scheduler: ``Generate`` streams an ``AsyncEngine``'s output deltas,
``Abort`` and ``GetStats`` pass through, plus the standard health service.

A client that cancels its stream (or whose deadline passes) aborts the request: the
cancellation reaches ``AsyncEngine.generate``, whose clean-up aborts it in the core."""
from __future__ import annotations

import logging

import grpc

from lenserve_contract.errors import InvalidRequestError
from lenserve_contract.proto import scheduler_pb2, scheduler_pb2_grpc
from services import rpc
from services.scheduler import convert
from services.scheduler.async_engine import AsyncEngine

log = logging.getLogger(__name__)
SERVICE_NAME = "lenserve.proto.SchedulerService"


class SchedulerServicer(scheduler_pb2_grpc.SchedulerServiceServicer):
    def __init__(self, engine: AsyncEngine):
        self.engine = engine

    async def Generate(self, request, context):
        try:
            stream = self.engine.generate(**convert.request_from_pb(request))
            num_output_tokens, first = 0, True
            async for out in stream:
                num_output_tokens += len(out.outputs[0].token_ids)
                yield convert.chunk_from_output(out, num_output_tokens, first)
                first = False
        except InvalidRequestError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc),
                                trailing_metadata=((rpc.FIELD_METADATA_KEY, exc.field),))
        except RuntimeError as exc:   # the engine stopped (shutdown or a bug in the loop)
            log.error("request %s failed: %s", request.request_id, exc)
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))

    async def Abort(self, request, context):
        return scheduler_pb2.AbortResponse(found=await self.engine.abort(request.request_id))

    async def GetStats(self, request, context):
        return convert.stats_to_pb(await self.engine.stats())


def build_server(engine: AsyncEngine, address: str) -> tuple[grpc.aio.Server, int]:
    """An unstarted server on address ('127.0.0.1:0' picks a free port)."""
    server, port = rpc.new_server(address, "scheduler")
    rpc.add_service(server, scheduler_pb2_grpc.add_SchedulerServiceServicer_to_server,
                    SchedulerServicer(engine))
    return server, port


async def mark_serving(server) -> None:
    await rpc.mark_serving(server, [SERVICE_NAME])
