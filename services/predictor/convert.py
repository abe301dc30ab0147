"""Core dataclasses ⇄ protobuf messages; the only place that knows both."""
from __future__ import annotations

from lenserve_contract.proto import common_pb2
from services.predictor.types import Completion, ObserveResult, Prediction, PredictionError, Source

_SOURCE_TO_PB = {
    Source.RETRIEVAL: common_pb2.PREDICTION_SOURCE_RETRIEVAL,
    Source.MLP: common_pb2.PREDICTION_SOURCE_MLP,
    Source.DEFAULT: common_pb2.PREDICTION_SOURCE_DEFAULT,
    Source.ORACLE: common_pb2.PREDICTION_SOURCE_ORACLE,
}
_PB_TO_SOURCE = {v: k for k, v in _SOURCE_TO_PB.items()}


def error_to_pb(err: PredictionError) -> common_pb2.ErrorDetail:
    code = common_pb2.ErrorCode.Value(f"ERROR_CODE_{err.code}")
    return common_pb2.ErrorDetail(code=code, message=err.message, field=err.field)


def error_from_pb(pb: common_pb2.ErrorDetail) -> PredictionError:
    name = common_pb2.ErrorCode.Name(pb.code).removeprefix("ERROR_CODE_")
    return PredictionError(name, pb.message, pb.field)


def prediction_to_pb(p: Prediction) -> common_pb2.Prediction:
    msg = common_pb2.Prediction(length=p.length, source=_SOURCE_TO_PB[p.source],
                                top_similarity=p.top_similarity, upper_quantile=p.upper_quantile)
    if p.error is not None:
        msg.error.CopyFrom(error_to_pb(p.error))
    return msg


def prediction_from_pb(pb: common_pb2.Prediction) -> Prediction:
    err = error_from_pb(pb.error) if pb.HasField("error") else None
    return Prediction(pb.length, _PB_TO_SOURCE[pb.source], pb.top_similarity,
                      pb.upper_quantile, err)


def completion_to_pb(c: Completion) -> common_pb2.CompletionRecord:
    return common_pb2.CompletionRecord(
        request_id=c.request_id, model=c.model, prompt=c.prompt,
        num_output_tokens=c.num_output_tokens, finish_reason=common_pb2.FINISH_REASON_STOP,
        predicted_length=c.predicted_length, finished_at=c.finished_at)


def completion_from_pb(pb: common_pb2.CompletionRecord) -> Completion:
    return Completion(model=pb.model, prompt=pb.prompt, num_output_tokens=pb.num_output_tokens,
                      request_id=pb.request_id, finished_at=pb.finished_at,
                      predicted_length=pb.predicted_length)


def observe_result_from_pb(pb) -> ObserveResult:
    return ObserveResult(pb.accepted, pb.rejected, tuple(error_from_pb(e) for e in pb.errors))
