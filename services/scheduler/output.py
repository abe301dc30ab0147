"""What the policy decides for one iteration, as plain data."""
from __future__ import annotations

from dataclasses import dataclass, field

from services.scheduler.request import Request


@dataclass(frozen=True)
class Budget:
    """Limits of one iteration: tokens fed to the model, and requests resident on the device."""

    max_num_batched_tokens: int
    max_num_seqs: int


@dataclass
class SchedulerOutput:
    iteration: int
    # (request, number of its tokens fed this iteration), in batch order. Tuples rather than
    # objects: this list is built for every running request on every iteration.
    scheduled: list[tuple[Request, int]] = field(default_factory=list)
    num_batched_tokens: int = 0
    preempted: list[Request] = field(default_factory=list)          # KV dropped (recompute)
    # Block moves the engine (or the kvmanager) performs before the iteration runs: first all
    # swap-outs (device -> host), then all swap-ins (host -> device), because a block freed by
    # a swap-out may be refilled by a swap-in of the same iteration.
    swapped_out: list[tuple[str, list[int]]] = field(default_factory=list)
    swapped_in: list[tuple[str, list[int]]] = field(default_factory=list)
    # Both kinds in the order the policy made them (a request may go out and back in, or in
    # and out, within one iteration; the copies must follow that order): (is_out, id, blocks).
    swap_sequence: list[tuple[bool, str, list[int]]] = field(default_factory=list)
    swap_refusals: list[tuple[str, str]] = field(default_factory=list)   # (request id, why)
    # FluidInfer: attention runs wave by wave, each a list of indices into ``scheduled``.
    waves: list[list[int]] | None = None
    # FluidInfer: ids of the scheduled requests whose KV stays in the host tier (status
    # SWAPPED) and streams through attention layer by layer.
    streamed: set[str] = field(default_factory=set)
    # The prefix cache's host tier (``prefix_host``), as KV manager owners: entries evicted
    # (freed before any copy), then blocks written back and uploaded (owner, device block).
    prefix_frees: list[str] = field(default_factory=list)
    prefix_writebacks: list[tuple[str, int]] = field(default_factory=list)
    prefix_uploads: list[tuple[str, int]] = field(default_factory=list)

    def add(self, request: Request, num_new_tokens: int) -> None:
        self.scheduled.append((request, num_new_tokens))
        self.num_batched_tokens += num_new_tokens

    @property
    def is_empty(self) -> bool:
        return not (self.scheduled or self.swapped_out or self.swapped_in or self.prefix_frees
                    or self.prefix_writebacks or self.prefix_uploads)

    @property
    def num_scheduled_requests(self) -> int:
        return len(self.scheduled)
