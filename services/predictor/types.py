"""Plain data exchanged with the predictor core (transport-free mirrors of the protos)."""
from __future__ import annotations

import enum
from dataclasses import dataclass


class Source(str, enum.Enum):
    RETRIEVAL = "retrieval"
    MLP = "mlp"
    DEFAULT = "default"
    ORACLE = "oracle"      # the true length, known to benchmarks (upper-bound experiments)


@dataclass(frozen=True)
class PredictionError:
    code: str  # an ErrorCode name without prefix, e.g. "UNKNOWN_MODEL"
    message: str
    field: str = ""


@dataclass(frozen=True)
class Prediction:
    length: int
    source: Source
    top_similarity: float
    upper_quantile: int
    error: PredictionError | None = None


@dataclass(frozen=True)
class Completion:
    """What a finished request teaches the predictor (CompletionRecord)."""

    model: str
    prompt: str
    num_output_tokens: int
    request_id: str = ""
    finished_at: float = 0.0
    predicted_length: int = 0


@dataclass(frozen=True)
class ObserveResult:
    accepted: int
    rejected: int
    errors: tuple[PredictionError, ...] = ()
