"""The request and workload types every loader produces and every bench backend consumes."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Sample:
    """One dataset row before tokenisation.

    Text datasets fill ``prompt`` and ``reference`` (the reference reply, whose token count
    becomes the output length); length traces fill ``prompt_len`` and ``output_len`` instead.
    ``timestamp`` is the trace's own arrival time in seconds, when it has one.
    ``hash_ids`` (Mooncake): the prompt's blocks of ``TRACE_BLOCK_TOKENS`` tokens, equal ids
    where requests share a prefix; prompts are synthesised block by block from them.
    """

    prompt: str | None = None
    reference: str | None = None
    prompt_len: int | None = None
    output_len: int | None = None
    timestamp: float | None = None
    hash_ids: tuple[int, ...] | None = None


TRACE_BLOCK_TOKENS = 512     # Mooncake's hash block


@dataclass(frozen=True)
class BenchRequest:
    """One request to replay: what to send, how many tokens to force out, and when.

    ``prompt_token_ids`` is always set, so that every backend sees exactly ``prompt_len``
    tokens; ``prompt`` is the text when the dataset has one (sent to HTTP endpoints).
    ``arrival_offset`` is in seconds after the start of the run.
    """

    request_id: str
    prompt_token_ids: tuple[int, ...]
    output_len: int
    arrival_offset: float = 0.0
    prompt: str | None = None
    # A follow-up turn: due ``think_s`` after the request ``after`` finished (its
    # ``arrival_offset`` is then only a lower bound, which keeps the workload ordered).
    after: str | None = None
    think_s: float = 0.0

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_token_ids)


@dataclass(frozen=True)
class Workload:
    """Requests in arrival order, plus where they came from (for the report)."""

    name: str
    requests: tuple[BenchRequest, ...]

    def __post_init__(self) -> None:
        offsets = [r.arrival_offset for r in self.requests]
        if offsets != sorted(offsets):
            raise ValueError("workload requests must be in arrival order")

    @property
    def total_output_tokens(self) -> int:
        return sum(r.output_len for r in self.requests)

    @property
    def total_prompt_tokens(self) -> int:
        return sum(r.prompt_len for r in self.requests)
