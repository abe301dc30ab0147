"""The one interface every scheduling policy implements.

A policy owns its queues (one FCFS queue for vLLM; priority queues for ALISE; prompt and
generation queues for EconoServe) and decides, once per iteration, which requests run and how
many of their tokens are fed. It changes request state only through ``SchedulerState``'s
transitions (admit, preempt, swap out/in), so block accounting, the running set and status
counts stay consistent whatever the policy does. The live scheduler, the in-process engine and
the simulator run the same policy objects.

Each policy has a frozen config class (``config_class``); ``--policy-config key=value`` fills
it, and an unknown key or a value of the wrong type is refused before anything runs.
"""
from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, ClassVar

from services.scheduler.config import SchedulerConfig
from services.scheduler.output import Budget, SchedulerOutput
from services.scheduler.request import Prediction, Request

if TYPE_CHECKING:
    from services.executor.types import ExecutorOutput
    from services.scheduler.state import SchedulerState


@dataclasses.dataclass(frozen=True)
class PolicyConfig:
    """Options of a policy. Subclasses add fields with defaults; all must be frozen."""


class Policy(ABC):
    name: str = "abstract"
    config_class: ClassVar[type[PolicyConfig]] = PolicyConfig
    # A request predicted shorter takes a resident's place, whatever the pool holds: a router
    # in front does not read the pool's fill as the wait a new request will see there.
    preempts_by_length: bool = False
    # The iteration waits for its swap-outs before it runs, and a swapped-out request's device
    # blocks serve that iteration (vLLM V0 copies on the compute stream before the forward
    # pass); False: the copies run beside the iteration and the blocks are free after it.
    swap_outs_before_forward: bool = False

    def __init__(self, config: SchedulerConfig, policy_config: PolicyConfig | None = None):
        self.config = config
        self.options = policy_config if policy_config is not None else self.config_class()
        if not isinstance(self.options, self.config_class):
            raise TypeError(f"policy {self.name!r} takes {self.config_class.__name__}, got "
                            f"{type(self.options).__name__}")

    def reserved_tokens(self, request: Request) -> int:
        """KV tokens the policy reserves when it admits the request (the prompt, or up to the
        context length under max-allocation; never more than ``max_model_len``, which the
        config guarantees fits the pool)."""
        return request.num_prompt_tokens

    @abstractmethod
    def add_request(self, request: Request) -> None:
        """Queue a newly arrived request (status WAITING). Its prediction may not be known
        yet: ``on_prediction`` follows when it arrives."""

    @abstractmethod
    def remove_request(self, request: Request) -> None:
        """Forget a request that is about to finish or be aborted. Called while its status is
        still the one it had in the policy's queues."""

    @abstractmethod
    def schedule(self, state: SchedulerState, budget: Budget) -> SchedulerOutput:
        """Decide one iteration. Must be O(running + admitted), never O(waiting): the waiting
        queue may hold tens of thousands of requests. ``budget`` is ``state.budget``."""

    def on_prediction(self, request: Request, prediction: Prediction) -> None:
        """The request's output-length prediction arrived (already stored on the request as
        ``request.prediction``). It may come after the request was queued, or even after it
        started running; length-aware policies re-rank it here."""

    def update(self, output: SchedulerOutput, updated: list[Request],
               result: ExecutorOutput | None = None) -> None:
        """Learn from the iteration's result: ``updated`` are the requests that got a token or
        finished (e.g. to demote on a mispredicted length, or regroup); ``result.timings``
        are the executor's measured times (e.g. to fit an execution-time model)."""

    def num_queued(self) -> int:
        """Requests waiting in the policy's queues (for stats; O(1))."""
        return 0

    def counters(self) -> dict[str, float]:
        """The policy's own event counters over its life (e.g. allocation failures), for
        the simulator's summaries; none by default."""
        return {}


def parse_policy_config(cls: type[PolicyConfig], items: dict[str, str] | list[str] | None
                        ) -> PolicyConfig:
    """``key=value`` strings (or a dict of strings) into the policy's frozen config, each
    value converted to its field's type. Unknown keys and bad values raise ValueError."""
    pairs = _pairs(items)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(pairs) - set(fields))
    if unknown:
        known = ", ".join(sorted(fields)) or "none"
        raise ValueError(f"unknown policy-config key(s) {', '.join(unknown)}; known: {known}")
    values = {k: _convert(k, v, fields[k]) for k, v in pairs.items()}
    return cls(**values)


def _pairs(items) -> dict[str, Any]:
    if not items:
        return {}
    if isinstance(items, dict):
        return dict(items)
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"policy-config entries are key=value, got {item!r}")
        out[key.strip().replace("-", "_")] = value.strip()
    return out


def _convert(key: str, value: Any, field: dataclasses.Field) -> Any:
    kind = field.type if isinstance(field.type, str) else getattr(field.type, "__name__", "")
    if not isinstance(value, str):
        return value
    try:
        if kind == "bool":
            if value.lower() not in ("1", "0", "true", "false", "yes", "no", "on", "off"):
                raise ValueError(value)
            return value.lower() in ("1", "true", "yes", "on")
        if kind == "int":
            return int(value)
        if kind == "float":
            return float(value)
    except ValueError:
        raise ValueError(f"policy-config {key}={value!r}: expected {kind}") from None
    return value
