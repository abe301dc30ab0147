"""A request as the scheduler tracks it, and its state machine.

    WAITING ──admit──▶ RUNNING ──finish──▶ FINISHED_{STOPPED,LENGTH,ABORTED,ERROR}
       ▲                 │  │
       └── PREEMPTED ◀───┘  └──▶ SWAPPED ──swap in──▶ RUNNING
     (KV dropped, recomputed)   (KV held on the host)
"""
from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from lenserve_contract.outputs import RequestMetrics
from lenserve_contract.sampling_params import SamplingParams


class RequestStatus(enum.Enum):
    # Members are singletons compared by identity: hash them as objects (in C) rather than by
    # Enum's Python-level hash of the name, which sat on the per-token path.
    __hash__ = object.__hash__

    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"     # KV dropped; waits to be recomputed
    SWAPPED = "swapped"         # KV moved to the host tier; waits to be swapped back in
    FINISHED_STOPPED = "finished_stopped"
    FINISHED_LENGTH = "finished_length"
    FINISHED_ABORTED = "finished_aborted"
    FINISHED_ERROR = "finished_error"

    @property
    def is_finished(self) -> bool:
        return self in _FINISHED


class FinishReason(enum.Enum):
    __hash__ = object.__hash__

    STOP = "stop"
    LENGTH = "length"
    ABORT = "abort"
    ERROR = "error"

    @property
    def status(self) -> RequestStatus:
        return _STATUS_OF[self]


_FINISHED = frozenset({RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH,
                       RequestStatus.FINISHED_ABORTED, RequestStatus.FINISHED_ERROR})
_STATUS_OF = {FinishReason.STOP: RequestStatus.FINISHED_STOPPED,
              FinishReason.LENGTH: RequestStatus.FINISHED_LENGTH,
              FinishReason.ABORT: RequestStatus.FINISHED_ABORTED,
              FinishReason.ERROR: RequestStatus.FINISHED_ERROR}


@dataclass(frozen=True)
class Prediction:
    """A request's predicted output length as the scheduler sees it: the point estimate, a
    calibrated upper quantile (for KV sizing), and where it came from (retrieval, mlp,
    default, oracle, given)."""

    length: int
    upper_quantile: int
    source: str = "given"


class Request:
    """Mutable per-request state. Only the scheduler core changes ``status``."""

    __slots__ = (
        "_eos_first",
        "eos_token_ids",
        "cache_hint",
        "num_cached_tokens",
        "error",
        "finish_reason",
        "metrics",
        "num_computed_tokens",
        "num_preemptions",
        "num_prompt_tokens",
        "prediction",
        "priority",
        "prompt_token_ids",
        "request_id",
        "sampling_params",
        "slo_deadline_s",
        "status",
        "stop_candidates",
        "stop_reason",
        "token_ids",
        "token_limit",
        "true_output_len",
    )

    def __init__(self, request_id: str, prompt_token_ids: list[int],
                 sampling_params: SamplingParams, arrival_time: float, *,
                 eos_token_id: int | Sequence[int] | None = None,
                 predicted_output_len: int | None = None,
                 priority: int = 0, slo_deadline_s: float | None = None,
                 true_output_len: int | None = None):
        self.request_id = request_id
        self.prompt_token_ids = list(prompt_token_ids)
        # The prompt never changes; its length is read for every request on every iteration.
        self.num_prompt_tokens = len(self.prompt_token_ids)
        self.sampling_params = sampling_params
        self.eos_token_id = eos_token_id
        # Prompt followed by outputs: recompute after preemption prefills all of it.
        self.token_ids = list(prompt_token_ids)
        self.num_computed_tokens = 0
        # A replayed trace's reply length: the request ends there as if the model had sampled
        # its end-of-sequence token (benchmarks replaying a trace with random weights). It is
        # the oracle predictor's input and no policy reads it: policies see max_tokens, the
        # client's cap, which a trace does not give away.
        self.true_output_len = true_output_len
        # Cached prefix tokens the policy planned this admission with (SchedulerState.
        # prefix_start); admission claims at most that many.
        self.cache_hint = 0
        # Its tokens the prefix cache held when last looked up (at arrival, on requeue and
        # at each admission attempt): what length-aware policies rank a queued request by.
        self.num_cached_tokens = 0
        self.fix_stop_conditions()
        self.status = RequestStatus.WAITING
        self.finish_reason: FinishReason | None = None
        self.stop_reason: int | str | None = None
        # Set by a length predictor (possibly after arrival); length-aware policies order and
        # size KV by it.
        self.prediction: Prediction | None = None
        if predicted_output_len is not None:
            self.prediction = Prediction(predicted_output_len, predicted_output_len)
        self.priority = priority
        self.slo_deadline_s = slo_deadline_s
        self.num_preemptions = 0
        self.metrics = RequestMetrics(arrival_time=arrival_time)
        self.error: str | None = None

    @property
    def eos_token_id(self) -> int | None:
        return self._eos_first

    @eos_token_id.setter
    def eos_token_id(self, value: int | Sequence[int] | None) -> None:
        """One id or several (a model whose generation config lists more than one EOS); the
        stop conditions read ``eos_token_ids``."""
        ids = (() if value is None else (value,) if isinstance(value, int) else tuple(value))
        self.eos_token_ids = frozenset(ids)
        self._eos_first = ids[0] if ids else None

    def fix_stop_conditions(self, max_model_len: int | None = None) -> None:
        """Derive what the token loop reads for every sampled token from the sampling
        parameters and ``eos_token_id``: the tokens that may stop the request (whether one does
        depends on min_tokens and ignore_eos) and the length at which it stops. The scheduler
        calls this when it takes the request, with its context limit; the parameters are
        fixed from then on."""
        params = self.sampling_params
        self.stop_candidates = frozenset(params.stop_token_ids).union(self.eos_token_ids)
        limit = self.num_prompt_tokens + params.max_tokens
        if self.true_output_len is not None:
            limit = min(limit, self.num_prompt_tokens + max(1, self.true_output_len))
        self.token_limit = limit if max_model_len is None else min(limit, max_model_len)

    @property
    def ends_as_traced(self) -> bool:
        """Whether it stops at the trace's reply length, before max_tokens or the context."""
        t = self.true_output_len
        return (t is not None and len(self.token_ids) == self.num_prompt_tokens + max(1, t)
                and t < self.sampling_params.max_tokens)

    @property
    def predicted_output_len(self) -> int | None:
        return None if self.prediction is None else self.prediction.length

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def is_finished(self) -> bool:
        return self.status.is_finished

    def __repr__(self) -> str:
        return (f"Request({self.request_id!r}, {self.status.value}, prompt={self.num_prompt_tokens}, "
                f"out={self.num_output_tokens}, computed={self.num_computed_tokens})")
