"""gRPC shell of the executor: one ``Execute`` call per iteration, ``GetModelInfo``, block
moves for a kvmanager (``ExportBlocks``/``ImportBlocks``: bytes through a shared-memory segment
the request names, never through protobuf), health, and ``CompileGrammar`` (a request's
grammar, ahead of its first iteration, on threads of its own beside the iterations).

Iterations run on one worker thread: the executor is not thread-safe (nor need it be, the
scheduler sends one iteration at a time), and the event loop stays free to answer health
checks during a long forward pass. The executor is built on that thread too
(``compute_thread``), and every other thread of the process keeps its torch work on itself
(``services.hardware.keep_torch_single_threaded``): a second OpenMP team, left by a model
built on the main thread, made each iteration 1.4x as long on a 2-core CPU. Block moves run
on a second thread, in arrival order, so that a swap-out overlaps the iteration running
meanwhile, as it does in one process: the serving core keeps a swapped-out request's device
blocks reserved until its copy is done, and waits for a swap-in before the iteration that
reads it."""
from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor

import grpc

from lenserve_contract.errors import InvalidRequestError
from lenserve_contract.proto import executor_pb2, executor_pb2_grpc
from lenserve_contract.sampling_params import StructuredOutput
from services import rpc
from services.executor import convert
from services.executor.interface import Executor
from services.executor.shared_blocks import AttachedSegments
from services.hardware import keep_torch_single_threaded

log = logging.getLogger(__name__)
SERVICE_NAME = "lenserve.proto.ExecutorService"


def compute_thread() -> ThreadPoolExecutor:
    """The thread that builds the executor and runs its iterations."""
    return ThreadPoolExecutor(1, thread_name_prefix="executor")


class ExecutorServicer(executor_pb2_grpc.ExecutorServiceServicer):
    """``worker``: the thread the executor was built on (``compute_thread``), or None for a
    new one."""

    def __init__(self, executor: Executor, worker: ThreadPoolExecutor | None = None):
        self.executor = executor
        self._worker = worker or compute_thread()
        self._mover = ThreadPoolExecutor(1, thread_name_prefix="executor-blocks",
                                         initializer=keep_torch_single_threaded)
        # Grammar compiles run beside iterations (xgrammar releases the GIL while compiling).
        self._compiler = ThreadPoolExecutor(2, thread_name_prefix="executor-grammar")
        self._segments: AttachedSegments | None = None

    async def Execute(self, request, context):
        out = await self._run(context, self._worker, f"iteration {request.iteration}",
                              self._execute, request)
        return convert.output_to_proto(out)

    def _execute(self, request):
        return self.executor.execute(convert.input_from_proto(request))

    async def CompileGrammar(self, request, context):
        so = StructuredOutput(request.kind, request.schema)
        await self._run(context, self._compiler, "a grammar compile",
                        self.executor.compile_grammar, so)
        return executor_pb2.CompileGrammarResponse()

    async def _run(self, context, pool: ThreadPoolExecutor, what: str, fn, *args):
        """``fn(*args)`` on ``pool``: bad input aborts the call with INVALID_ARGUMENT and the
        field, anything else (a bug, a device fault) with INTERNAL; the server keeps serving."""
        try:
            return await asyncio.get_running_loop().run_in_executor(pool, fn, *args)
        except InvalidRequestError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc),
                                trailing_metadata=((rpc.FIELD_METADATA_KEY, exc.field),))
        except Exception as exc:  # noqa: BLE001 - said to the caller and logged
            log.exception("%s failed", what)
            await context.abort(grpc.StatusCode.INTERNAL, f"{type(exc).__name__}: {exc}")

    async def GetModelInfo(self, request, context):
        return convert.model_info_to_proto(self.executor.model_info())

    async def ExportBlocks(self, request, context):
        return await self._move(request, context, export=True)

    async def ImportBlocks(self, request, context):
        return await self._move(request, context, export=False)

    async def _move(self, request, context, export: bool):
        ids = list(request.block_ids)
        what = f"{'export' if export else 'import'} of {len(ids)} blocks"
        num_bytes = await self._run(context, self._mover, what, self._move_blocks,
                                    request.shm_name, ids, export, request.int8,
                                    request.num_tokens or None)
        return executor_pb2.BlockDataResponse(num_bytes=num_bytes)

    def _move_blocks(self, name: str, block_ids: list[int], export: bool, int8: bool = False,
                     num_tokens: int | None = None) -> int:
        info = self.executor.model_info()
        bad = [b for b in block_ids if not 0 <= b < info.num_gpu_blocks]
        if bad:     # checked here: not every executor checks what it is asked to move
            raise InvalidRequestError(f"unknown KV block id(s) {bad[:8]}: the pool has blocks "
                                      f"0..{info.num_gpu_blocks - 1}", field="block_ids")
        if self._segments is None:
            self._segments = AttachedSegments(info)
        if int8:
            return self._move_int8(name, block_ids, export, num_tokens)
        view = self._segments.view(name, len(block_ids))
        if export:
            self.executor.export_blocks(block_ids, out=view)
        else:
            self.executor.import_blocks(block_ids, view)
        return view.numel() * view.element_size()

    def _move_int8(self, name: str, block_ids: list[int], export: bool,
                   num_tokens: int | None) -> int:
        from services.kvmanager.int8 import packed_nbytes
        info = self.executor.model_info()
        nbytes = packed_nbytes(info.num_layers, len(block_ids), info.block_size,
                               info.num_kv_heads * info.head_dim)
        view = self._segments.bytes_view(name, nbytes)
        if export:
            self.executor.export_blocks_int8(block_ids, num_tokens, out=view)
        else:
            self.executor.import_blocks_int8(block_ids, view)
        return nbytes

    def close(self) -> None:
        self._worker.shutdown(wait=True)
        self._mover.shutdown(wait=True)
        self._compiler.shutdown(wait=True)
        if self._segments is not None:
            self._segments.close()
        self.executor.close()


def build_server(executor: Executor, address: str, worker: ThreadPoolExecutor | None = None
                 ) -> tuple[grpc.aio.Server, int, ExecutorServicer]:
    """An unstarted server on address ('127.0.0.1:0' picks a free port) and its servicer;
    ``worker`` as for ``ExecutorServicer``."""
    server, port = rpc.new_server(address, "executor")
    servicer = ExecutorServicer(executor, worker)
    rpc.add_service(server, executor_pb2_grpc.add_ExecutorServiceServicer_to_server, servicer)
    return server, port, servicer


async def mark_serving(server) -> None:
    await rpc.mark_serving(server, [SERVICE_NAME])
