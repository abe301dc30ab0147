"""gRPC shell of the predictor: PredictorService plus the standard health service."""
from __future__ import annotations

import asyncio
import logging

import grpc

from lenserve_contract.proto import predictor_pb2, predictor_pb2_grpc
from services import rpc
from services.predictor import convert
from services.predictor.core import Predictor
from services.predictor.types import PredictionError

log = logging.getLogger(__name__)
SERVICE_NAME = "lenserve.proto.PredictorService"
# A batch bigger than this is a client bug; refuse it rather than stall every other caller.
MAX_PROMPTS_PER_CALL = 4096

class PredictorServicer(predictor_pb2_grpc.PredictorServiceServicer):
    def __init__(self, predictor: Predictor):
        self.predictor = predictor

    async def Predict(self, request, context):
        if len(request.prompts) > MAX_PROMPTS_PER_CALL:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"at most {MAX_PROMPTS_PER_CALL} prompts per call, "
                                f"got {len(request.prompts)}")
        # Embedding is CPU-bound; a worker thread keeps the event loop answering health checks.
        preds = await asyncio.to_thread(self.predictor.predict, list(request.prompts),
                                        request.model)
        return predictor_pb2.PredictResponse(
            predictions=[convert.prediction_to_pb(p) for p in preds])

    async def Observe(self, request, context):
        if len(request.records) > MAX_PROMPTS_PER_CALL:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"at most {MAX_PROMPTS_PER_CALL} records per call, "
                                f"got {len(request.records)}")
        records = [convert.completion_from_pb(r) for r in request.records]
        try:
            result = await asyncio.to_thread(self.predictor.observe, records)
        except Exception as exc:
            log.exception("observe failed")
            err = convert.error_to_pb(PredictionError("INTERNAL", str(exc)))
            return predictor_pb2.ObserveResponse(accepted=0, rejected=len(records), errors=[err])
        return predictor_pb2.ObserveResponse(
            accepted=result.accepted, rejected=result.rejected,
            errors=[convert.error_to_pb(e) for e in result.errors])

def build_server(predictor: Predictor, address: str) -> tuple[grpc.aio.Server, int]:
    """An unstarted grpc.aio server on address ('127.0.0.1:0' picks a free port)."""
    server, port = rpc.new_server(address, "predictor")
    # Undecodable bytes get INVALID_ARGUMENT, not grpc's INTERNAL with a logged traceback.
    rpc.add_service(server, predictor_pb2_grpc.add_PredictorServiceServicer_to_server,
                    PredictorServicer(predictor))
    return server, port

async def mark_serving(server) -> None:
    await rpc.mark_serving(server, [SERVICE_NAME])
