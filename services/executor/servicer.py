"""gRPC shell of the executor: one ``Execute`` call per iteration, ``GetModelInfo``, health.

Iterations run on one worker thread: the executor is not thread-safe (nor need it be, the
scheduler sends one iteration at a time), and the event loop stays free to answer health
checks during a long forward pass."""
from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor

import grpc

from lenserve_contract.errors import InvalidRequestError
from lenserve_contract.proto import executor_pb2_grpc
from services import rpc
from services.executor import convert
from services.executor.interface import Executor

log = logging.getLogger(__name__)
SERVICE_NAME = "lenserve.proto.ExecutorService"
NO_BLOCK_DATA = ("block data moves over shared memory between the executor and a kvmanager "
                 "process; this executor serves no block data over gRPC")


class ExecutorServicer(executor_pb2_grpc.ExecutorServiceServicer):
    def __init__(self, executor: Executor):
        self.executor = executor
        self._worker = ThreadPoolExecutor(1, thread_name_prefix="executor")

    async def Execute(self, request, context):
        try:
            batch = convert.input_from_proto(request)
            loop = asyncio.get_running_loop()
            out = await loop.run_in_executor(self._worker, self.executor.execute, batch)
        except InvalidRequestError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc),
                                trailing_metadata=((rpc.FIELD_METADATA_KEY, exc.field),))
        except Exception as exc:  # noqa: BLE001 - a bug or a device fault: say so, keep serving
            log.exception("iteration %d failed", request.iteration)
            await context.abort(grpc.StatusCode.INTERNAL, f"{type(exc).__name__}: {exc}")
        return convert.output_to_proto(out)

    async def GetModelInfo(self, request, context):
        return convert.model_info_to_proto(self.executor.model_info())

    async def ExportBlocks(self, request, context):
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, NO_BLOCK_DATA)

    async def ImportBlocks(self, request, context):
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, NO_BLOCK_DATA)

    def close(self) -> None:
        self._worker.shutdown(wait=True)
        self.executor.close()


def build_server(executor: Executor, address: str
                 ) -> tuple[grpc.aio.Server, int, ExecutorServicer]:
    """An unstarted server on address ('127.0.0.1:0' picks a free port) and its servicer."""
    server, port = rpc.new_server(address, "executor")
    servicer = ExecutorServicer(executor)
    rpc.add_service(server, executor_pb2_grpc.add_ExecutorServiceServicer_to_server, servicer)
    return server, port, servicer


async def mark_serving(server) -> None:
    await rpc.mark_serving(server, [SERVICE_NAME])
