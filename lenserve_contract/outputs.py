"""Request results, shaped like vLLM's RequestOutput."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Logprob:
    """A sampled token's log-probability under the model (before temperature, penalties and
    masks, as vLLM reports it by default) and the ``k`` most likely tokens at its position,
    most likely first, as (token id, log-probability)."""

    token_id: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None   # "stop" | "length" | "abort" | "error" | None (running)
    stop_reason: int | str | None = None
    logprobs: list[Logprob] | None = None   # one per token of token_ids, when requested


@dataclass
class RequestMetrics:
    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    finished_time: float | None = None
    token_times: list[float] = field(default_factory=list)
    predicted_output_len: int | None = None   # set when a length prediction arrived
    prediction_source: str | None = None
    num_cached_tokens: int = 0                # prompt tokens served from the prefix cache


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    metrics: RequestMetrics | None = None
    error: str | None = None
