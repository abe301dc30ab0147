"""One request in flight: its stream from the scheduler, the token counts for ``usage`` (the
prompt once, every choice's output), the latencies for the metrics, and the abort when the
client goes away first. A request with ``n > 1`` has n choices, each output naming those that
changed by their ``index``."""
from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator
from typing import NamedTuple

from gateway.errors import APIError, invalid
from gateway.failures import GenerationFailed, failure
from gateway.metrics import GatewayMetrics
from gateway.sampling import Prompt
from lenserve_contract.errors import InvalidRequestError
from lenserve_contract.outputs import RequestOutput
from lenserve_contract.sampling_params import SamplingParams

log = logging.getLogger(__name__)


class Delta(NamedTuple):
    """What one output added to one choice."""

    index: int
    text: str
    finish_reason: str | None
    logprobs: list | None
# Detached aborts, referenced until done (the loop keeps only weak references to tasks).
_ABORTS: set[asyncio.Task] = set()


class Generation:
    def __init__(self, backend, metrics: GatewayMetrics, request_id: str, started: float):
        self.backend, self.metrics = backend, metrics
        self.request_id, self.started = request_id, started
        self.iterator: AsyncIterator[RequestOutput] | None = None
        self.first: RequestOutput | None = None
        self.first_token_at: float | None = None
        self.num_prompt = self.num_output = 0
        self.finish_reasons: dict[int, str] = {}     # choice index -> why it ended
        self.prediction_source: str | None = None
        self.finished = False
        self.logprobs: dict[int, list] = {}     # choice index -> every token's, when asked

    @classmethod
    async def start(cls, backend, metrics: GatewayMetrics, prompt: Prompt,
                    params: SamplingParams, kwargs: dict, prefix: str) -> Generation:
        """Send the request and wait for its first output, so that a refusal is still an HTTP
        error (400 for bad input, 503 when the scheduler is unreachable, 504 past a deadline),
        not a broken stream."""
        gen = cls(backend, metrics, f"{prefix}-{uuid.uuid4().hex}", time.monotonic())
        gen.iterator = backend.generate(sampling_params=params, request_id=gen.request_id,
                                        **prompt.kwargs(), **kwargs)
        try:
            gen.first = await anext(gen.iterator)
        except InvalidRequestError as exc:
            raise invalid(exc) from None
        except StopAsyncIteration:
            raise APIError(503, "the scheduler ended the request without output") from None
        except Exception as exc:  # noqa: BLE001 - whatever the transport raised
            raise failure(exc, gen.request_id) from None
        return gen

    async def deltas(self) -> AsyncIterator[list[Delta]]:
        """Per output, the deltas of its choices, until the request finishes."""
        try:
            out, self.first = self.first, None
            while True:
                yield self._take(out)
                if self.finished:
                    return
                out = await anext(self.iterator)
        finally:
            if not self.finished:
                self._abort_detached()

    def _take(self, out: RequestOutput) -> list[Delta]:
        deltas = []
        for c in out.outputs:
            if c.logprobs is not None:
                self.logprobs.setdefault(c.index, []).extend(c.logprobs)
            if c.token_ids and self.first_token_at is None:
                self.first_token_at = time.monotonic()
            self.num_output += len(c.token_ids)
            # A choice that ends says why; on the request's last output, one that does not
            # ended normally.
            reason = c.finish_reason or ("stop" if out.finished else None)
            if reason is not None:
                self.finish_reasons.setdefault(c.index, reason)
            deltas.append(Delta(c.index, c.text, reason, c.logprobs))
        self.num_prompt = len(out.prompt_token_ids)
        if out.metrics is not None and out.metrics.prediction_source:
            self.prediction_source = out.metrics.prediction_source
        if out.finished:
            self._finish(out)
        return deltas

    @property
    def finish_reason(self) -> str | None:
        """The first choice's (``n = 1``: the request's)."""
        return self.finish_reasons.get(0)

    def _finish(self, out: RequestOutput) -> None:
        self.finished = True
        now = time.monotonic()
        ttft = None if self.first_token_at is None else self.first_token_at - self.started
        self.metrics.finished(ttft, now - self.started, self.num_prompt, self.num_output,
                              self.prediction_source)
        if "error" in self.finish_reasons.values() or (out.error and not out.outputs):
            raise GenerationFailed(out.error or "generation failed")

    def usage(self) -> dict:
        return {"prompt_tokens": self.num_prompt, "completion_tokens": self.num_output,
                "total_tokens": self.num_prompt + self.num_output}

    def _abort_detached(self) -> None:
        """The client left: abort upstream from a task of its own, because the handler's task
        is being cancelled and could not await anything more."""
        task = asyncio.get_running_loop().create_task(self._abort())
        _ABORTS.add(task)
        task.add_done_callback(_ABORTS.discard)

    async def _abort(self) -> None:
        try:
            await self.iterator.aclose()
            await self.backend.abort(self.request_id)
        except Exception:  # noqa: BLE001 - the request is gone either way
            log.debug("abort of %s failed", self.request_id, exc_info=True)
