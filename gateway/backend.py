"""What the gateway needs of the scheduler: the call shape ``AsyncEngine`` and the gRPC
scheduler client share."""
from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Protocol

from lenserve_contract.outputs import RequestOutput
from lenserve_contract.sampling_params import SamplingParams


class SchedulerBackend(Protocol):
    def generate(self, prompt: str | None = None, sampling_params: SamplingParams | None = None,
                 request_id: str | None = None, *, prompt_token_ids: list[int] | None = None,
                 **request_kwargs) -> AsyncIterator[RequestOutput]:
        """Yield RequestOutput deltas until one has ``finished``. Bad input raises
        ``InvalidRequestError`` on the first iteration; closing the iterator early aborts."""

    async def abort(self, request_id: str) -> bool:
        """Abort a request; False if it is unknown or already finished."""

    async def stats(self) -> Any:
        """A ``SchedulerStats``-shaped snapshot (queue lengths, blocks); fields read by name."""
