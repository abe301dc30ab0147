"""Failures past the parameters reach the client in words, with a status to match, and never
as an internal repr: a scheduler that is gone is a 503 ``scheduler unavailable`` (in an SSE
error event once the stream has begun), a deadline a 504, the engine failing a request a 500."""
from __future__ import annotations

import json

import grpc
import httpx
import pytest
from gateway_helpers import ServedScheduler, long_engine, start_gateway

from gateway.failures import GenerationFailed, describe_failure

REPR_MARKERS = ("AioRpcError", "StatusCode", "debug_error_string", "127.0.0.1", "Traceback")


def rpc_error(code: grpc.StatusCode) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(),
                                "failed to connect to all addresses; ipv4:127.0.0.1:50051")


@pytest.mark.parametrize("exc, status, code", [
    (rpc_error(grpc.StatusCode.UNAVAILABLE), 503, "scheduler_unavailable"),
    (rpc_error(grpc.StatusCode.CANCELLED), 503, "scheduler_unavailable"),
    (ConnectionError("the scheduler ended the subscription"), 503, "scheduler_unavailable"),
    (rpc_error(grpc.StatusCode.DEADLINE_EXCEEDED), 504, "scheduler_timeout"),
    (TimeoutError(), 504, "scheduler_timeout"),
    (GenerationFailed("executor failed: <AioRpcError ...>"), 500, "generation_failed"),
    (rpc_error(grpc.StatusCode.INTERNAL), 502, "scheduler_error"),
    (RuntimeError("boom at 0x7f00"), 502, "scheduler_error"),
])
def test_each_failure_is_described_in_words(exc, status, code):
    err = describe_failure(exc)
    assert (err.status, err.code) == (status, code)
    assert not any(marker in err.message for marker in REPR_MARKERS + ("boom", "executor"))


class FailingBackend:
    """The engine's first output, then ``error`` (or ``error`` at once with ``at_start``)."""

    def __init__(self, engine, error: Exception, at_start: bool = False):
        self.engine, self.error, self.at_start = engine, error, at_start

    async def generate(self, *args, **kwargs):
        if self.at_start:
            raise self.error
        async for out in self.engine.generate(*args, **kwargs):
            yield out
            raise self.error

    async def abort(self, request_id):
        return await self.engine.abort(request_id)

    async def stats(self):
        return await self.engine.stats()


@pytest.fixture
def failing_gateway(gateway_factory):
    def make(error: Exception, at_start: bool = False):
        return gateway_factory(long_engine(),
                               wrap=lambda engine: FailingBackend(engine, error, at_start))
    return make


BODY = {"prompt": "hello", "max_tokens": 50, "ignore_eos": True}


def error_of(resp: httpx.Response, status: int) -> dict:
    assert resp.status_code == status, resp.text
    assert not any(marker in resp.text for marker in REPR_MARKERS), resp.text
    return resp.json()["error"]


def sse_error(url: str) -> dict:
    with httpx.stream("POST", url + "/v1/completions", json={**BODY, "stream": True},
                      timeout=30) as resp:
        assert resp.status_code == 200
        events = [line.removeprefix("data: ") for line in resp.iter_lines()
                  if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    errors = [json.loads(e)["error"] for e in events[:-1] if "error" in json.loads(e)]
    assert len(errors) == 1 and not any(m in json.dumps(errors) for m in REPR_MARKERS)
    return errors[0]


def test_scheduler_lost_mid_request_is_503_in_words(failing_gateway):
    gw = failing_gateway(rpc_error(grpc.StatusCode.UNAVAILABLE))
    error = error_of(httpx.post(gw.url + "/v1/completions", json=BODY, timeout=30), 503)
    assert error["message"].startswith("scheduler unavailable")
    assert error["code"] == "scheduler_unavailable" and error["type"] == "service_unavailable"
    assert sse_error(gw.url)["code"] == "scheduler_unavailable"


def test_a_deadline_is_504_before_and_after_the_first_output(failing_gateway):
    deadline = rpc_error(grpc.StatusCode.DEADLINE_EXCEEDED)
    gw = failing_gateway(deadline, at_start=True)
    error = error_of(httpx.post(gw.url + "/v1/completions", json=BODY, timeout=30), 504)
    assert error["code"] == "scheduler_timeout" and "in time" in error["message"]
    gw = failing_gateway(deadline)
    assert sse_error(gw.url)["code"] == "scheduler_timeout"


def test_engine_failure_is_500_without_the_engines_text(failing_gateway):
    gw = failing_gateway(GenerationFailed("executor failed: <AioRpcError of RPC ...>"))
    error = error_of(httpx.post(gw.url + "/v1/completions", json=BODY, timeout=30), 500)
    assert error["code"] == "generation_failed" and "executor" not in error["message"]


def test_a_stopped_grpc_scheduler_is_503_scheduler_unavailable():
    """The case met in the field: the gRPC scheduler goes away under a running stream, and
    the next request finds nothing listening."""
    served = []

    def serve(engine):
        served.append(ServedScheduler(engine))
        return served[-1].backend

    gw, server = start_gateway(long_engine(), wrap=serve, max_tokens_limit=50_000)
    try:
        body = {**BODY, "max_tokens": 50_000, "stream": True}
        with httpx.stream("POST", gw.url + "/v1/completions", json=body, timeout=60) as resp:
            assert resp.status_code == 200
            lines = resp.iter_lines()
            next(line for line in lines if line.startswith("data: "))
            served[0].stop()
            rest = [line for line in lines if line.startswith("data: ")]
        assert rest[-1] == "data: [DONE]"
        event = json.loads(rest[-2].removeprefix("data: "))
        assert event["error"]["code"] == "scheduler_unavailable", event
        assert not any(marker in "".join(rest) for marker in REPR_MARKERS)
        error = error_of(httpx.post(gw.url + "/v1/completions", json=BODY, timeout=60), 503)
        assert error["message"].startswith("scheduler unavailable")
    finally:
        server.stop()
        gw.engine.shutdown()
