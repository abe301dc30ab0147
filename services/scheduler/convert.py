"""Generation requests, output deltas and stats to and from ``scheduler.proto``/``common.proto``.

A stream's first chunk carries the prompt's token ids; the client keeps them, so every
``RequestOutput`` it yields looks like the ``AsyncEngine``'s (token and text deltas)."""
from __future__ import annotations

import dataclasses

from lenserve_contract.convert import (
    logprob_from_proto,
    logprob_to_proto,
    sampling_params_from_proto,
    sampling_params_to_proto,
)
from lenserve_contract.errors import InvalidRequestError
from lenserve_contract.outputs import CompletionOutput, RequestMetrics, RequestOutput
from lenserve_contract.proto import common_pb2, scheduler_pb2
from lenserve_contract.sampling_params import SamplingParams
from services.scheduler.scheduler import SchedulerStats

FINISH_TO_PB = {None: common_pb2.FINISH_REASON_UNSPECIFIED, "stop": common_pb2.FINISH_REASON_STOP,
                "length": common_pb2.FINISH_REASON_LENGTH, "abort": common_pb2.FINISH_REASON_ABORT,
                "error": common_pb2.FINISH_REASON_ERROR}
FINISH_FROM_PB = {v: k for k, v in FINISH_TO_PB.items()}
REQUEST_KWARGS = ("priority", "slo_deadline_s", "predicted_output_len")


# -- requests -------------------------------------------------------------------------------
def request_to_pb(request_id: str, prompt: str | None, sampling_params: SamplingParams | None,
                  prompt_token_ids: list[int] | None, **kwargs) -> common_pb2.Request:
    unknown = set(kwargs) - set(REQUEST_KWARGS)
    if unknown:
        raise TypeError(f"generate() got unexpected keyword arguments {sorted(unknown)}")
    try:
        return _request(request_id, prompt, sampling_params, prompt_token_ids, kwargs)
    except (TypeError, ValueError) as exc:   # a value protobuf cannot hold: the caller's fault
        raise InvalidRequestError(f"bad request: {exc}") from None


def _request(request_id, prompt, sampling_params, prompt_token_ids, kwargs) -> common_pb2.Request:
    msg = common_pb2.Request(request_id=request_id, prompt_token_ids=prompt_token_ids or [],
                             priority=kwargs.get("priority") or 0)
    if prompt is not None:
        msg.prompt = prompt
    if sampling_params is not None:
        msg.sampling_params.CopyFrom(sampling_params_to_proto(sampling_params))
    for name in ("slo_deadline_s", "predicted_output_len"):
        if kwargs.get(name) is not None:
            setattr(msg, name, kwargs[name])
    return msg


def request_from_pb(msg: common_pb2.Request) -> dict:
    """``AsyncEngine.generate`` keyword arguments; bad sampling parameters raise
    InvalidRequestError."""
    kwargs = dict(prompt=msg.prompt if msg.HasField("prompt") else None, request_id=msg.request_id or None,
                  prompt_token_ids=list(msg.prompt_token_ids) or None,
                  sampling_params=sampling_params_from_proto(msg.sampling_params),
                  priority=msg.priority)
    for name in ("slo_deadline_s", "predicted_output_len"):
        if msg.HasField(name):
            kwargs[name] = getattr(msg, name)
    return kwargs


# -- outputs --------------------------------------------------------------------------------
def chunks_from_output(out: RequestOutput, counts: dict[int, int],
                       first: bool) -> list[common_pb2.TokenChunk]:
    """One chunk per choice of a delta (one for ``n = 1``; each choice of an ``n > 1``
    request that changed); ``counts`` (choice index -> output tokens sent so far) is updated.
    Only the request's last chunk is ``finished``."""
    chunks, last = [], len(out.outputs) - 1
    for k, c in enumerate(out.outputs):
        count = counts[c.index] = counts.get(c.index, 0) + len(c.token_ids)
        chunks.append(chunk_from_output(out, count, first and k == 0, c,
                                        out.finished and k == last))
    return chunks


def chunk_from_output(out: RequestOutput, num_output_tokens: int, first: bool,
                      c: CompletionOutput | None = None,
                      finished: bool | None = None) -> common_pb2.TokenChunk:
    """One delta of a stream (of choice ``c``, the first by default); ``num_output_tokens``
    is that choice's count so far, this delta included."""
    c = c if c is not None else out.outputs[0]
    chunk = common_pb2.TokenChunk(
        request_id=out.request_id, token_ids=c.token_ids, text=c.text,
        finished=out.finished if finished is None else finished,
        finish_reason=FINISH_TO_PB[c.finish_reason], index=c.index,
        num_prompt_tokens=len(out.prompt_token_ids), num_output_tokens=num_output_tokens,
        prompt_token_ids=out.prompt_token_ids if first else ())
    if c.logprobs:
        chunk.logprobs.extend(logprob_to_proto(e) for e in c.logprobs)
    if isinstance(c.stop_reason, str):
        chunk.stop_string = c.stop_reason
    elif isinstance(c.stop_reason, int):
        chunk.stop_token_id = c.stop_reason
    metrics = out.metrics
    if metrics is not None and metrics.prediction_source:
        chunk.prediction_source = source_to_pb(metrics.prediction_source)
        chunk.predicted_output_len = metrics.predicted_output_len or 0
    if out.error:
        chunk.error.CopyFrom(common_pb2.ErrorDetail(code=common_pb2.ERROR_CODE_INTERNAL,
                                                    message=out.error))
    return chunk


def error_chunk(request_id: str, message: str) -> common_pb2.TokenChunk:
    """The last chunk of a request the engine could not go on with (it stopped)."""
    return common_pb2.TokenChunk(
        request_id=request_id, finished=True, finish_reason=common_pb2.FINISH_REASON_ERROR,
        error=common_pb2.ErrorDetail(code=common_pb2.ERROR_CODE_UNAVAILABLE, message=message))


PREDICTION_SOURCES = frozenset(common_pb2.PredictionSource.keys())


def source_to_pb(source: str) -> int:
    """``RequestMetrics.prediction_source`` ("retrieval", "mlp", ...) -> PredictionSource."""
    name = f"PREDICTION_SOURCE_{source.upper()}"
    return common_pb2.PredictionSource.Value(name) if name in PREDICTION_SOURCES else 0


def source_from_pb(value: int) -> str | None:
    if not value:
        return None
    return common_pb2.PredictionSource.Name(value).removeprefix("PREDICTION_SOURCE_").lower()


def output_from_chunk(chunk: common_pb2.TokenChunk, prompt: str | None,
                      prompt_token_ids: list[int],
                      metrics: RequestMetrics | None = None) -> RequestOutput:
    which = chunk.WhichOneof("stop_reason")
    completion = CompletionOutput(
        index=chunk.index, text=chunk.text, token_ids=list(chunk.token_ids),
        finish_reason=FINISH_FROM_PB.get(chunk.finish_reason),
        stop_reason=getattr(chunk, which) if which else None,
        logprobs=[logprob_from_proto(e) for e in chunk.logprobs] if chunk.logprobs else None)
    error = chunk.error.message if chunk.HasField("error") else None
    return RequestOutput(chunk.request_id, prompt, prompt_token_ids, [completion],
                         chunk.finished, metrics, error)


# -- stats ----------------------------------------------------------------------------------
def stats_to_pb(stats: SchedulerStats) -> scheduler_pb2.SchedulerStats:
    return scheduler_pb2.SchedulerStats(**dataclasses.asdict(stats))


def stats_from_pb(msg: scheduler_pb2.SchedulerStats) -> SchedulerStats:
    return SchedulerStats(**{f.name: getattr(msg, f.name)
                             for f in dataclasses.fields(SchedulerStats)})


def load_to_pb(load) -> scheduler_pb2.ReplicaLoad:
    t0, alpha, beta = load.rates or (0.0, 0.0, 0.0)
    return scheduler_pb2.ReplicaLoad(
        stats=stats_to_pb(load.stats), block_size=load.block_size,
        queued_prefill_tokens=load.queued_prefill_tokens,
        remaining_decode_tokens=load.remaining_decode_tokens,
        num_unpredicted=load.num_unpredicted, rates_fitted=load.rates is not None,
        t0_s=t0, alpha_s=alpha, beta_s=beta, draining=load.draining,
        preempts_by_length=load.preempts_by_length)


def load_from_pb(msg: scheduler_pb2.ReplicaLoad):
    from services.scheduler.load import ReplicaLoad
    rates = (msg.t0_s, msg.alpha_s, msg.beta_s) if msg.rates_fitted else None
    return ReplicaLoad(stats_from_pb(msg.stats), msg.block_size, msg.queued_prefill_tokens,
                       msg.remaining_decode_tokens, msg.num_unpredicted, rates, msg.draining,
                       msg.preempts_by_length)
