"""The one interface every scheduling policy implements.

A policy owns its queues (one FCFS queue for vLLM; priority queues for ALISE; prompt and
generation queues for EconoServe) and decides, once per iteration, which requests run and how
many of their tokens are fed. It changes request state only through ``SchedulerState``'s
transitions (admit, preempt, swap out/in), so block accounting and status counts stay
consistent whatever the policy does. The live scheduler, the in-process engine and the
simulator run the same policy objects.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

from services.scheduler.config import SchedulerConfig
from services.scheduler.output import Budget, SchedulerOutput
from services.scheduler.request import Request

if TYPE_CHECKING:
    from services.scheduler.state import SchedulerState


class Policy(ABC):
    name: str = "abstract"

    def __init__(self, config: SchedulerConfig):
        self.config = config

    def reserved_tokens(self, request: Request) -> int:
        """KV tokens the policy reserves when it admits the request (the prompt, or up to the
        context length under max-allocation; never more than ``max_model_len``, which the
        config guarantees fits the pool)."""
        return request.num_prompt_tokens

    @abstractmethod
    def add_request(self, request: Request) -> None:
        """Queue a newly arrived request (status WAITING)."""

    @abstractmethod
    def remove_request(self, request: Request) -> None:
        """Forget a request that is about to finish or be aborted. Called while its status is
        still the one it had in the policy's queues."""

    @abstractmethod
    def schedule(self, state: SchedulerState, budget: Budget) -> SchedulerOutput:
        """Decide one iteration. Must be O(running + admitted), never O(waiting): the waiting
        queue may hold tens of thousands of requests."""

    def update(self, output: SchedulerOutput, updated: list[Request]) -> None:
        """Learn from the iteration's result: ``updated`` are the requests that got a token or
        finished (e.g. to demote on a mispredicted length, or regroup)."""

    def num_queued(self) -> int:
        """Requests waiting in the policy's queues (for stats; O(1))."""
        return 0
