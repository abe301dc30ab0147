import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from lenserve_contract.proto import predictor_pb2, predictor_pb2_grpc
from services.predictor.client import AsyncPredictorClient, PredictorClient
from services.predictor.servicer import (
    MAX_PROMPTS_PER_CALL,
    SERVICE_NAME,
    build_server,
    mark_serving,
)
from services.predictor.types import Completion, Source


@pytest.fixture
async def server(predictor):
    srv, port = build_server(predictor, "127.0.0.1:0")
    await srv.start()
    await mark_serving(srv)
    yield f"127.0.0.1:{port}"
    await srv.stop(grace=1)


async def test_client_matches_in_process_predictor(server, predictor):
    client = AsyncPredictorClient(server)
    records = [Completion("m", "List the planets of the solar system.", 40, "r1", 1.0),
               Completion("m", "", 3, "bad")]
    result = await client.observe(records)
    assert (result.accepted, result.rejected) == (1, 1)
    assert result.errors[0].code == "INVALID_ARGUMENT" and "bad" in result.errors[0].message
    prompts = ["List the planets of the solar system.", "", "What is love?"]
    remote = await client.predict(prompts, model="m")
    local = predictor.predict(prompts, model="m")
    assert remote == [type(p)(p.length, p.source, pytest.approx(p.top_similarity, abs=1e-6),
                              p.upper_quantile, p.error) for p in local]
    assert remote[0].source is Source.RETRIEVAL and remote[1].error.code == "INVALID_ARGUMENT"
    await client.close()


async def test_health_and_oversized_batch(server):
    async with grpc.aio.insecure_channel(server) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        resp = await health.Check(health_pb2.HealthCheckRequest(service=SERVICE_NAME))
        assert resp.status == health_pb2.HealthCheckResponse.SERVING
        stub = predictor_pb2_grpc.PredictorServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.Predict(predictor_pb2.PredictRequest(
                prompts=["x"] * (MAX_PROMPTS_PER_CALL + 1)))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_sync_client_unreachable_raises_clearly():
    from tests.predictor.conftest import free_port

    with PredictorClient(f"127.0.0.1:{free_port()}", timeout_s=1) as client:
        with pytest.raises(grpc.RpcError) as err:
            client.predict(["hi"])
        assert err.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
