"""A replica's load as a router places by it (``StreamLoad``): the queue, the running set,
the KV pool, the work its unfinished requests still need in tokens, and the rates of its
execution-time model. Pure: read from an ``EngineCore`` on the engine's thread.

The work is counted from each request's prediction (a router that predicted the length once
sends it with the request, so the replica holds it from arrival); a request without one is
counted at ``default_output_len``. One pass over the unfinished requests: a stats interval
of a tenth of a second costs the engine thread microseconds per hundred requests."""
from __future__ import annotations

from dataclasses import dataclass

from services.scheduler.policies.time_model import ExecutionTimeModel
from services.scheduler.scheduler import SchedulerStats

DEFAULT_OUTPUT_LEN = 256


@dataclass(frozen=True)
class ReplicaLoad:
    stats: SchedulerStats
    block_size: int
    queued_prefill_tokens: int
    remaining_decode_tokens: int
    num_unpredicted: int = 0
    rates: tuple[float, float, float] | None = None    # (T0, alpha, beta) once fitted
    draining: bool = False
    # The policy lets a request predicted shorter take a resident's place (``alise``).
    preempts_by_length: bool = False


def time_model_of(engine) -> ExecutionTimeModel | None:
    """The engine's own model (the scheduler service keeps one), else its policy's."""
    model = getattr(engine, "time_model", None)
    if model is None:
        model = getattr(engine.scheduler.policy, "model", None)
    return model if isinstance(model, ExecutionTimeModel) else None


def replica_load(engine, default_output_len: int = DEFAULT_OUTPUT_LEN,
                 draining: bool = False) -> ReplicaLoad:
    prefill = decode = unpredicted = 0
    for request in engine.scheduler.state.requests.values():
        # Tokens still to feed beyond a decode's one (a preempted request recomputes all).
        pending = request.num_tokens - request.num_computed_tokens
        prefill += pending if request.num_output_tokens == 0 else max(0, pending - 1)
        predicted = request.predicted_output_len
        if predicted is None:
            unpredicted += 1
            predicted = default_output_len
        decode += max(1, predicted - request.num_output_tokens)
    model = time_model_of(engine)
    rates = model.rates() if model is not None and model.fitted else None
    return ReplicaLoad(engine.stats(), engine.scheduler.config.block_size, prefill, decode,
                       unpredicted, rates, draining, engine.scheduler.policy.preempts_by_length)
