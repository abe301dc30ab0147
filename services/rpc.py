"""What every lenserve gRPC service shares: method handlers that refuse undecodable bytes with
INVALID_ARGUMENT, the standard health service, channel options for quick reconnects, and
serving until SIGINT/SIGTERM with a graceful stop.

grpc's own handlers answer a request that does not parse with INTERNAL and log a traceback
on the server; a malformed request is the caller's fault, so it gets INVALID_ARGUMENT and
nothing in the log."""
from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable, Iterable

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

log = logging.getLogger(__name__)

# A restarted peer is found within a second, not after grpc's default backoff (up to 120 s).
CHANNEL_OPTIONS = (("grpc.initial_reconnect_backoff_ms", 100),
                   ("grpc.min_reconnect_backoff_ms", 100),
                   ("grpc.max_reconnect_backoff_ms", 1000))
FIELD_METADATA_KEY = "lenserve-field"   # the offending field of an INVALID_ARGUMENT


class Malformed:
    """Stands in for a request whose bytes did not parse."""

    __slots__ = ("error",)

    def __init__(self, error: str):
        self.error = error


def strip_scheme(target: str) -> str:
    """'grpc://host:port' or 'host:port' -> 'host:port'."""
    return target.removeprefix("grpc://")


def _tolerant(parse: Callable[[bytes], object]) -> Callable[[bytes], object]:
    def deserialize(data: bytes):
        try:
            return parse(data)
        except Exception as exc:  # noqa: BLE001 - DecodeError and friends: the bytes are bad
            return Malformed(str(exc) or type(exc).__name__)
    return deserialize


async def _refuse(request: Malformed, context) -> None:
    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"malformed request: {request.error}")


def _guard_unary(behaviour):
    async def handler(request, context):
        if isinstance(request, Malformed):
            await _refuse(request, context)
        return await behaviour(request, context)
    return handler


def _guard_stream(behaviour):
    async def handler(request, context):
        if isinstance(request, Malformed):
            await _refuse(request, context)
        async for item in behaviour(request, context):
            yield item
    return handler


def _guard(h: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    if h.request_streaming:
        # A stream's handler reads each message and refuses a ``Malformed`` one itself.
        return h._replace(request_deserializer=_tolerant(h.request_deserializer))
    return h._replace(
        request_deserializer=_tolerant(h.request_deserializer),
        unary_unary=_guard_unary(h.unary_unary) if h.unary_unary else None,
        unary_stream=_guard_stream(h.unary_stream) if h.unary_stream else None)


class _Capture:
    """Receives what a generated ``add_*Servicer_to_server`` registers."""

    def __init__(self):
        self.services: dict[str, dict[str, grpc.RpcMethodHandler]] = {}

    def add_generic_rpc_handlers(self, handlers) -> None:
        pass

    def add_registered_method_handlers(self, name: str, handlers: dict) -> None:
        self.services[name] = handlers


def add_service(server: grpc.aio.Server, add_to_server: Callable, servicer) -> None:
    """Like the generated ``add_*Servicer_to_server``, with malformed requests refused."""
    capture = _Capture()
    add_to_server(servicer, capture)
    for name, handlers in capture.services.items():
        guarded = {method: _guard(h) for method, h in handlers.items()}
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(name, guarded),))
        server.add_registered_method_handlers(name, guarded)


def new_server(address: str, what: str) -> tuple[grpc.aio.Server, int]:
    """An unstarted grpc.aio server with the health service, bound to address
    ('127.0.0.1:0' picks a free port)."""
    server = grpc.aio.server()
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    server.health = health_servicer  # type: ignore[attr-defined]
    port = server.add_insecure_port(address)
    if port == 0:
        raise ValueError(f"cannot bind the {what} service to {address}")
    return server, port


async def mark_serving(server: grpc.aio.Server, names: Iterable[str]) -> None:
    for name in ("", *names):
        await server.health.set(name, health_pb2.HealthCheckResponse.SERVING)


async def wait_for_signal() -> None:
    done = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, done.set)
    await done.wait()


def check_health(target: str, timeout_s: float = 1.0) -> bool:
    """True when the server at target answers its health check with SERVING."""
    with grpc.insecure_channel(strip_scheme(target)) as channel:
        try:
            resp = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=timeout_s)
        except grpc.RpcError:
            return False
    return resp.status == health_pb2.HealthCheckResponse.SERVING
