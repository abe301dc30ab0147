"""gRPC client with the same Python interface as the in-process Predictor."""
from __future__ import annotations

from collections.abc import Sequence

import grpc

from lenserve_contract.proto import predictor_pb2, predictor_pb2_grpc
from services import rpc
from services.predictor import convert
from services.predictor.types import Completion, ObserveResult, Prediction


class PredictorClient:
    def __init__(self, target: str, timeout_s: float = 10.0):
        self.target = target
        self.timeout_s = timeout_s
        self._channel = grpc.insecure_channel(target, options=rpc.CHANNEL_OPTIONS)
        self._stub = predictor_pb2_grpc.PredictorServiceStub(self._channel)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def predict(self, prompts: Sequence[str], model: str = "") -> list[Prediction]:
        resp = self._stub.Predict(predictor_pb2.PredictRequest(model=model, prompts=list(prompts)),
                                  timeout=self.timeout_s)
        return [convert.prediction_from_pb(p) for p in resp.predictions]

    def observe(self, records: Sequence[Completion]) -> ObserveResult:
        req = predictor_pb2.ObserveRequest(records=[convert.completion_to_pb(r) for r in records])
        return convert.observe_result_from_pb(self._stub.Observe(req, timeout=self.timeout_s))


class AsyncPredictorClient:
    """The same calls for an asyncio caller (the scheduler overlaps them with queueing)."""

    def __init__(self, target: str, timeout_s: float = 10.0):
        self.timeout_s = timeout_s
        self._channel = grpc.aio.insecure_channel(target, options=rpc.CHANNEL_OPTIONS)
        self._stub = predictor_pb2_grpc.PredictorServiceStub(self._channel)

    async def close(self) -> None:
        await self._channel.close()

    async def predict(self, prompts: Sequence[str], model: str = "") -> list[Prediction]:
        req = predictor_pb2.PredictRequest(model=model, prompts=list(prompts))
        resp = await self._stub.Predict(req, timeout=self.timeout_s)
        return [convert.prediction_from_pb(p) for p in resp.predictions]

    async def observe(self, records: Sequence[Completion]) -> ObserveResult:
        req = predictor_pb2.ObserveRequest(records=[convert.completion_to_pb(r) for r in records])
        return convert.observe_result_from_pb(await self._stub.Observe(req, timeout=self.timeout_s))
