"""The ``KVManager`` interface over gRPC: what the scheduler uses for a kvmanager service.

The service moves block bytes with the executor over shared memory; this client only sends
control. Errors are the in-process manager's (``HostPoolFullError``, ``RequestNotHeldError``,
``InvalidRequestError``, ``ValueError``); a failed copy raises ``SwapFailedError`` and an
unreachable service ``KVManagerUnavailableError``, both RuntimeErrors.

On connect the client resets the service (frees every host block): a scheduler that starts
owns no swapped requests, so whatever the pool holds belongs to one that is gone. The
service therefore serves one scheduler. ``holds`` asks the service only about requests this
client has swapped out and not seen come back, so the serving loop's check of every
finished request costs no call."""
from __future__ import annotations

import operator
import threading
import weakref

import grpc

from lenserve_contract.errors import InvalidRequestError
from lenserve_contract.proto import kvmanager_pb2 as pb
from lenserve_contract.proto import kvmanager_pb2_grpc
from services import rpc
from services.kvmanager import wire
from services.kvmanager.interface import KVManager, KVStats, SwapHandle
from services.kvmanager.wire import KVManagerUnavailableError, SwapFailedError

__all__ = ["KVManagerClient", "KVManagerUnavailableError", "SwapFailedError"]


class RemoteSwapHandle(SwapHandle):
    def __init__(self, client: KVManagerClient, swap_id: int, request_id: str, is_in: bool):
        self._client, self.swap_id = client, swap_id
        self.request_id, self.is_in = request_id, is_in
        self._result: pb.SwapResult | None = None
        self._lock = threading.Lock()

    def done(self) -> bool:
        if self._result is None:
            self._settle(self._client._poll(self))
        return self._result is not None

    def wait(self) -> None:
        if self._result is None:
            self._settle(self._client._wait(self))
        if self._result.error:
            raise SwapFailedError(self._result.error)

    def _settle(self, result: pb.SwapResult) -> None:
        with self._lock:
            if result.done and self._result is None:
                self._result = result
                self._client._settled(self)


class KVManagerClient(KVManager):
    def __init__(self, target: str, *, timeout_s: float = 60.0,
                 connect_timeout_s: float = 60.0, reset: bool = True):
        self.target = rpc.strip_scheme(target)
        self.timeout_s = timeout_s
        self._channel = grpc.insecure_channel(self.target, options=rpc.CHANNEL_OPTIONS)
        self._stub = kvmanager_pb2_grpc.KVManagerServiceStub(self._channel)
        self._closed = False
        # request id -> True while its KV may be on the host (swap-out started, no swap-in
        # seen to land, not freed)
        self._maybe_held: dict[str, bool] = {}
        self._unsettled: weakref.WeakValueDictionary[int, RemoteSwapHandle] = (
            weakref.WeakValueDictionary())
        # Waits for the service to come up: the scheduler may start first.
        layout = self._call(self._stub.Describe, pb.DescribeRequest(), connect_timeout_s,
                            wait_for_ready=True)
        self._num_host_blocks, self._block_bytes = layout.num_host_blocks, layout.host_block_bytes
        self._copies_overlap = layout.copies_overlap
        if reset:
            self._call(self._stub.Reset, pb.ResetRequest())

    # -- queries ----------------------------------------------------------------------------

    @property
    def num_host_blocks(self) -> int:
        self._check_open()
        return self._num_host_blocks

    @property
    def host_block_bytes(self) -> int:
        return self._block_bytes

    @property
    def copies_overlap(self) -> bool:
        return self._copies_overlap

    def num_free_host_blocks(self) -> int:
        return self.stats().num_free_host_blocks

    def holds(self, request_id: str) -> bool:
        self._check_open()
        if request_id not in self._maybe_held:
            return False
        held = self._call(self._stub.Holds, pb.RequestRef(request_id=request_id)).holds
        if not held and not self._in_flight(request_id):
            self._maybe_held.pop(request_id, None)
        return held

    def stats(self) -> KVStats:
        self._check_open()
        return wire.stats_from_proto(self._call(self._stub.GetStats, pb.KVStatsRequest()))

    def check_integrity(self) -> None:
        self._check_open()
        report = self._call(self._stub.CheckIntegrity, pb.IntegrityRequest())
        assert report.ok, report.problem

    # -- swaps ------------------------------------------------------------------------------

    def swap_out(self, request_id: str, device_blocks: list[int],
                 num_tokens: int | None = None) -> SwapHandle:
        self._check_open()
        request = pb.SwapOutRequest(request_id=request_id,
                                    device_blocks=_ints(device_blocks, "device_blocks"))
        if num_tokens is not None:
            request.num_tokens = _int(num_tokens, "num_tokens")
        ticket = self._call(self._stub.SwapOut, request, request_id=request_id)
        self._maybe_held[request_id] = True
        return self._handle(ticket, request_id, is_in=False)

    def swap_in(self, request_id: str, device_blocks: list[int]) -> SwapHandle:
        self._check_open()
        request = pb.SwapInRequest(request_id=request_id,
                                   device_blocks=_ints(device_blocks, "device_blocks"))
        ticket = self._call(self._stub.SwapIn, request, request_id=request_id)
        return self._handle(ticket, request_id, is_in=True)

    def free(self, request_id: str) -> None:
        self._check_open()
        if self._maybe_held.pop(request_id, None) is None:
            return
        self._call(self._stub.Free, pb.RequestRef(request_id=request_id))

    def wait_all(self) -> None:
        self._check_open()
        self._wait_all()

    def _wait_all(self) -> None:
        response = self._call(self._stub.WaitAll, pb.WaitAllRequest(), timeout_s=None)
        for result in response.results:
            handle = self._unsettled.get(result.swap_id)
            if handle is not None:
                handle._settle(result)

    def close(self) -> None:
        """Finish outstanding copies, free the service's host blocks, hang up."""
        if self._closed:
            return
        try:
            self._wait_all()
            self._call(self._stub.Reset, pb.ResetRequest())
        except KVManagerUnavailableError:
            pass            # nothing to finish or free on a service that is gone
        finally:
            self._closed = True
            self._channel.close()

    # -- handles ----------------------------------------------------------------------------

    def _handle(self, ticket: pb.SwapTicket, request_id: str, is_in: bool) -> RemoteSwapHandle:
        handle = RemoteSwapHandle(self, ticket.swap_id, request_id, is_in)
        self._unsettled[ticket.swap_id] = handle
        return handle

    def _poll(self, handle: RemoteSwapHandle) -> pb.SwapResult:
        return self._call(self._stub.PollSwap, pb.SwapTicket(swap_id=handle.swap_id))

    def _wait(self, handle: RemoteSwapHandle) -> pb.SwapResult:
        return self._call(self._stub.WaitSwap, pb.SwapTicket(swap_id=handle.swap_id),
                          timeout_s=None)

    def _settled(self, handle: RemoteSwapHandle) -> None:
        self._unsettled.pop(handle.swap_id, None)
        if handle.is_in and not handle._result.error and not self._in_flight(handle.request_id):
            self._maybe_held.pop(handle.request_id, None)

    def _in_flight(self, request_id: str) -> bool:
        return any(h.request_id == request_id for h in list(self._unsettled.values()))

    # -- calls ------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("the KV manager client is closed")

    def _call(self, method, request, timeout_s: float | None = -1.0, *,
              request_id: str = "", wait_for_ready: bool = False):
        timeout = self.timeout_s if timeout_s == -1.0 else timeout_s
        try:
            return method(request, timeout=timeout, wait_for_ready=wait_for_ready)
        except grpc.RpcError as err:
            raise wire.error_from_rpc(err, request_id, self.target) from None


def _ints(values, field: str) -> list[int]:
    """What the in-process manager refuses as bad input must not be coerced on the wire."""
    bad = [v for v in values if _as_int32(v) is None]
    if bad:
        raise InvalidRequestError(f"unknown device block id(s) {bad[:8]}: block ids are int32 "
                                  "integers", field=field)
    return [_as_int32(v) for v in values]


def _int(value, field: str) -> int:
    as_int = _as_int32(value)
    if as_int is None:
        raise InvalidRequestError(f"{field} must be an int32 integer, got {value!r}",
                                  field=field)
    return as_int


def _as_int32(value) -> int | None:
    if isinstance(value, bool):
        return None
    try:
        value = operator.index(value)
    except TypeError:
        return None
    return value if -2**31 <= value < 2**31 else None
