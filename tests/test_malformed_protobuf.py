"""Malformed protobuf on every method of every gRPC service: INVALID_ARGUMENT, nothing in the
server log (grpc's own handling answers INTERNAL and logs a traceback), and the server keeps
serving. The methods come from the service descriptors, so a new RPC is covered the day it
is added."""
from __future__ import annotations

import logging

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from lenserve_contract.proto import (
    executor_pb2,
    kvmanager_pb2,
    predictor_pb2,
    scheduler_pb2,
)
from services.executor.fake import FakeExecutor

GARBAGE = b"\xff\xff\xff\xff"     # field 31, wire type 7: no parser accepts it


def _executor(address):
    from services.executor.servicer import build_server
    server, port, _ = build_server(FakeExecutor(), address)
    return server, port


def _scheduler(address):
    from services.scheduler.async_engine import AsyncEngine
    from services.scheduler.servicer import build_server
    from services.scheduler.wiring import EngineConfig
    return build_server(AsyncEngine(EngineConfig(model="fake", block_size=4,
                                                 num_gpu_blocks=16)), address)


def _predictor(address):
    from services.predictor.servicer import build_server
    return build_server(object(), address)      # a refused request never reaches the core


def _kvmanager(address):
    from services.kvmanager.servicer import build_server
    server, port, _ = build_server(object(), address)
    return server, port


SERVICES = {
    "ExecutorService": (executor_pb2, _executor),
    "SchedulerService": (scheduler_pb2, _scheduler),
    "PredictorService": (predictor_pb2, _predictor),
    "KVManagerService": (kvmanager_pb2, _kvmanager),
}
CASES = [(service, method.name, method.server_streaming)
         for service, (module, _) in SERVICES.items()
         for method in module.DESCRIPTOR.services_by_name[service].methods]


def test_every_service_is_covered():
    assert {s for s, _, _ in CASES} == set(SERVICES) and len(CASES) >= 20


def _router(address):
    from services.router.core import RouterCore
    from services.router.runtime import Router
    from services.router.servicer import build_server
    return build_server(Router(RouterCore()), address)


@pytest.mark.parametrize("service", list(SERVICES))
async def test_malformed_bytes_are_invalid_argument_and_not_logged(service, caplog):
    await _check(service, SERVICES[service][1], caplog)


async def test_the_router_refuses_malformed_bytes_as_the_scheduler_does(caplog):
    await _check("SchedulerService", _router, caplog)


async def _check(service, build, caplog):
    module = SERVICES[service][0]
    server, port = build("127.0.0.1:0")
    await server.start()
    caplog.set_level(logging.DEBUG)
    full = module.DESCRIPTOR.services_by_name[service].full_name
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            for _, method, streaming in [c for c in CASES if c[0] == service]:
                path = f"/{full}/{method}"
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    if streaming:
                        await channel.unary_stream(path)(GARBAGE, timeout=5).read()
                    else:
                        await channel.unary_unary(path)(GARBAGE, timeout=5)
                assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, method
                assert "malformed" in err.value.details(), method
            health = await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=5)
            assert health.status == health_pb2.HealthCheckResponse.SERVING
    finally:
        await server.stop(grace=0)
    noisy = [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info]
    assert not noisy, [r.getMessage() for r in noisy]
