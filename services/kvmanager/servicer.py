"""gRPC shell of the KV manager: the ``KVManager`` interface call for call, plus health.

Every call into the core runs on one worker thread, the core's one caller (it is not
thread-safe, and ``free``/``wait_all`` block until copies end, which must not stall the event
loop). Waiting on a copy does not take that thread: ``WaitSwap`` awaits the copy's future, so
a scheduler waiting on a swap-in never holds up another call.

Started copies are kept by ticket until a ``WaitSwap``, a ``PollSwap`` that finds them done,
or a ``WaitAll`` reports them; at most ``max_tickets`` finished ones are kept unreported (the
oldest are forgotten first), so a caller that never asks cannot grow the table."""
from __future__ import annotations

import asyncio
import itertools
import logging
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import grpc

from lenserve_contract.errors import InvalidRequestError
from lenserve_contract.proto import kvmanager_pb2 as pb
from lenserve_contract.proto import kvmanager_pb2_grpc
from services import rpc
from services.kvmanager import wire
from services.kvmanager.copier import FutureHandle
from services.kvmanager.core import InProcessKVManager
from services.kvmanager.interface import HostPoolFullError, RequestNotHeldError

log = logging.getLogger(__name__)
SERVICE_NAME = "lenserve.proto.KVManagerService"


class KVManagerServicer(kvmanager_pb2_grpc.KVManagerServiceServicer):
    def __init__(self, core: InProcessKVManager, max_tickets: int = 4096):
        self.core = core
        self.max_tickets = max_tickets
        self._worker = ThreadPoolExecutor(1, thread_name_prefix="kvmanager")
        self._tickets: OrderedDict[int, FutureHandle] = OrderedDict()
        self._ids = itertools.count(1)

    async def _run(self, context, fn: Callable, *args):
        """``fn(*args)`` on the core's thread; the interface's errors become status codes."""
        try:
            return await asyncio.get_running_loop().run_in_executor(self._worker, fn, *args)
        except InvalidRequestError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc),
                                trailing_metadata=((rpc.FIELD_METADATA_KEY, exc.field),))
        except HostPoolFullError as exc:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc),
                                trailing_metadata=wire.pool_full_metadata(exc))
        except RequestNotHeldError as exc:
            await context.abort(grpc.StatusCode.NOT_FOUND, exc.reason)
        except ValueError as exc:               # a swap-out of a request already held
            await context.abort(grpc.StatusCode.ALREADY_EXISTS, str(exc))
        except Exception as exc:  # a bug or a closed core: say so, keep serving
            log.exception("%s failed", getattr(fn, "__name__", fn))
            await context.abort(grpc.StatusCode.INTERNAL, f"{type(exc).__name__}: {exc}")

    # -- layout, queries --------------------------------------------------------------------

    async def Describe(self, request, context):
        core = self.core
        return pb.KVLayout(num_host_blocks=core.num_host_blocks,
                           host_block_bytes=core.host_block_bytes, int8=core.config.int8,
                           copies_overlap=core.copies_overlap)

    async def GetStats(self, request, context):
        return wire.stats_to_proto(await self._run(context, self.core.stats))

    async def Holds(self, request, context):
        return pb.HoldsResponse(holds=await self._run(context, self.core.holds,
                                                      request.request_id))

    async def CheckIntegrity(self, request, context):
        problem = await self._run(context, self._integrity_problem)
        return pb.IntegrityReport(ok=not problem, problem=problem)

    def _integrity_problem(self) -> str:
        try:
            self.core.check_integrity()
        except AssertionError as exc:
            return str(exc) or "integrity check failed"
        return ""

    # -- swaps ------------------------------------------------------------------------------

    async def SwapOut(self, request, context):
        tokens = request.num_tokens if request.HasField("num_tokens") else None
        handle = await self._run(context, self.core.swap_out, request.request_id,
                                 list(request.device_blocks), tokens)
        return self._ticket(handle)

    async def SwapIn(self, request, context):
        handle = await self._run(context, self.core.swap_in, request.request_id,
                                 list(request.device_blocks))
        return self._ticket(handle)

    def _ticket(self, handle: FutureHandle) -> pb.SwapTicket:
        swap_id = next(self._ids)
        self._tickets[swap_id] = handle
        if len(self._tickets) > self.max_tickets:
            self._forget_finished(len(self._tickets) - self.max_tickets)
        return pb.SwapTicket(swap_id=swap_id)

    def _forget_finished(self, count: int) -> None:
        done = [i for i, h in self._tickets.items() if h.done()][:count]
        for swap_id in done:
            del self._tickets[swap_id]

    async def WaitSwap(self, request, context):
        handle = await self._handle(request.swap_id, context)
        await asyncio.wait([asyncio.wrap_future(handle.future)])
        return self._report(request.swap_id)

    async def PollSwap(self, request, context):
        handle = await self._handle(request.swap_id, context)
        if not handle.done():
            return pb.SwapResult(swap_id=request.swap_id, done=False)
        return self._report(request.swap_id)

    async def _handle(self, swap_id: int, context) -> FutureHandle:
        handle = self._tickets.get(swap_id)
        if handle is None:
            await context.abort(grpc.StatusCode.NOT_FOUND,
                                f"no copy with ticket {swap_id} (already reported, or never "
                                "started here)")
        return handle

    def _report(self, swap_id: int) -> pb.SwapResult:
        handle = self._tickets.pop(swap_id, None)
        error = handle.future.exception() if handle is not None else None
        return pb.SwapResult(swap_id=swap_id, done=True,
                             error="" if error is None else wire.describe(error))

    async def WaitAll(self, request, context):
        await self._run(context, self.core.wait_all)
        finished = [i for i, h in self._tickets.items() if h.done()]
        return pb.WaitAllResponse(results=[self._report(i) for i in finished])

    async def Free(self, request, context):
        await self._run(context, self.core.free, request.request_id)
        return pb.FreeResponse()

    async def Reset(self, request, context):
        return pb.ResetResponse(num_freed=await self._run(context, self.core.free_all))

    def close(self) -> None:
        self._worker.submit(self.core.close).result()
        self._worker.shutdown(wait=True)


def build_server(core: InProcessKVManager, address: str
                 ) -> tuple[grpc.aio.Server, int, KVManagerServicer]:
    """An unstarted server on address ('127.0.0.1:0' picks a free port) and its servicer."""
    server, port = rpc.new_server(address, "kvmanager")
    servicer = KVManagerServicer(core)
    rpc.add_service(server, kvmanager_pb2_grpc.add_KVManagerServiceServicer_to_server, servicer)
    return server, port, servicer


async def mark_serving(server) -> None:
    await rpc.mark_serving(server, [SERVICE_NAME])
