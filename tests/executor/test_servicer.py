"""The executor over gRPC against the executor in-process: same tokens, clear failures."""
from __future__ import annotations

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from lenserve.engine.llm_engine import EngineConfig, LLMEngine
from lenserve_contract.errors import InvalidRequestError
from lenserve_contract.proto import executor_pb2, executor_pb2_grpc
from lenserve_contract.sampling_params import SamplingParams
from services.executor.fake import FakeExecutor
from services.executor.runner import InProcessExecutor
from services.executor.servicer import SERVICE_NAME
from services.executor.types import ExecutorInput, ScheduledSequence
from tests.executor.remote import ServedExecutor

PROMPTS = ["The quick brown fox", "Hello there, how are", "one two three four five six"]


def run_engine(executor, model: str, **params) -> dict[str, list[int]]:
    engine = LLMEngine(EngineConfig(model=model, max_num_batched_tokens=16, check_integrity=True),
                       executor=executor)
    for i, p in enumerate(PROMPTS):
        engine.add_request(str(i), prompt=p, sampling_params=SamplingParams(max_tokens=6, **params))
    finished = {}
    while engine.has_unfinished_requests():
        finished.update({o.request_id: o.outputs[0].token_ids for o in engine.step() if o.finished})
    return finished


@pytest.fixture
def served_fake():
    served = ServedExecutor(FakeExecutor(num_gpu_blocks=64, block_size=4, max_model_len=128))
    yield served
    served.stop()


def test_model_info_and_health_match(served_fake):
    client = served_fake.client()
    assert client.model_info() == served_fake.servicer.executor.model_info()
    with grpc.insecure_channel(served_fake.target) as channel:
        resp = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=SERVICE_NAME), timeout=5)
    assert resp.status == health_pb2.HealthCheckResponse.SERVING
    client.close()


@pytest.mark.parametrize("params", [dict(temperature=0), dict(temperature=1.0, seed=7)])
def test_opt_tiny_over_grpc_gives_the_in_process_tokens(params):
    local = run_engine(InProcessExecutor("opt-tiny", block_size=4, num_gpu_blocks=32), "opt-tiny",
                       **params)
    served = ServedExecutor(InProcessExecutor("opt-tiny", block_size=4, num_gpu_blocks=32))
    try:
        remote = run_engine(served.client(), "opt-tiny", **params)
    finally:
        served.stop()
    assert remote == local and all(len(t) == 6 for t in local.values())


def test_invalid_batch_is_invalid_argument_with_its_field(served_fake):
    seq = ScheduledSequence("r", [1, 2], 0, [0], True, SamplingParams(), block_table_is_delta=True)
    with pytest.raises(InvalidRequestError, match="delta") as err:
        served_fake.client().execute(ExecutorInput(0, [seq]))
    assert err.value.field == "block_table"


def test_malformed_bytes_are_invalid_argument(served_fake):
    with grpc.insecure_channel(served_fake.target) as channel:
        raw = channel.unary_unary(f"/{SERVICE_NAME}/Execute")
        with pytest.raises(grpc.RpcError) as err:
            raw(b"\xff\xff\xff\xff", timeout=5)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "malformed" in err.value.details()
        stub = executor_pb2_grpc.ExecutorServiceStub(channel)   # the server still serves
        assert stub.GetModelInfo(executor_pb2.ModelInfoRequest(), timeout=5).name == "fake"


def test_executor_restart_fails_in_flight_requests_then_serves_again():
    def fake():
        return FakeExecutor(num_gpu_blocks=64, block_size=4, max_model_len=128)

    served = ServedExecutor(fake())
    port, client = served.port, served.client()
    engine = LLMEngine(EngineConfig(model="fake"), executor=client)
    engine.add_request("a", prompt="hello", sampling_params=SamplingParams(max_tokens=50))
    engine.step()
    served.stop()                                   # the executor dies mid-run
    [failed] = engine.step()
    assert failed.outputs[0].finish_reason == "error"
    assert "executor at 127.0.0.1" in failed.error and "UNAVAILABLE" in failed.error
    served = ServedExecutor(fake(), port=port)      # ... and comes back on its address
    try:
        engine.add_request("b", prompt="again", sampling_params=SamplingParams(max_tokens=3))
        finished = {}
        while engine.has_unfinished_requests():
            finished.update({o.request_id: o for o in engine.step() if o.finished})
        assert finished["b"].outputs[0].finish_reason == "length"
    finally:
        served.stop()
        client.close()
