"""``openai:<url>``: any OpenAI-compatible server, through streaming ``/v1/completions``.

Requests are sent as in ``vllm bench serve``: ``stream: true``, ``ignore_eos``, ``max_tokens``
set to the request's output length. Each streamed chunk that carries text is timed on
arrival; the token count comes from the final ``usage`` when the server sends it.
"""
from __future__ import annotations

import asyncio
import json
import queue
import threading
import time

import httpx

from lenserve.bench.backends.base import Backend, BackendOptions, failed_record
from lenserve.bench.metrics import RequestRecord
from lenserve.workloads.types import BenchRequest


def completions_url(base: str) -> str:
    """``http://host:port``, ``.../v1`` or the full ``.../v1/completions`` -> the full URL."""
    url = httpx.URL(base)
    if url.scheme not in ("http", "https") or not url.host:
        raise ValueError(f"openai backend needs an http(s) URL, got {base!r}")
    path = url.path.rstrip("/")
    if not path.endswith("/completions"):
        path = path + ("/completions" if path.endswith("/v1") else "/v1/completions")
    return str(url.copy_with(path=path))


class OpenAIBackend(Backend):
    def __init__(self, name: str, base_url: str, options: BackendOptions):
        super().__init__(name, options)
        self.url = completions_url(base_url)
        self._results: queue.Queue[RequestRecord] = queue.Queue()
        self._pending = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._client: httpx.AsyncClient | None = None

    def start(self) -> None:
        # The replay loop is synchronous; requests run concurrently on an event loop thread.
        self._loop = asyncio.new_event_loop()
        threading.Thread(target=self._loop.run_forever, daemon=True).start()
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
        self._client = httpx.AsyncClient(timeout=self.options.request_timeout_s, limits=limits)

    def submit(self, request: BenchRequest, arrival_time: float) -> None:
        self._pending += 1
        asyncio.run_coroutine_threadsafe(self._send(request, arrival_time), self._loop)

    def poll(self, timeout: float) -> list[RequestRecord]:
        done = []
        try:
            done.append(self._results.get(timeout=timeout) if timeout > 0 else self._results.get_nowait())
            while True:
                done.append(self._results.get_nowait())
        except queue.Empty:
            pass
        self._pending -= len(done)
        return done

    def has_pending(self) -> bool:
        return self._pending > 0

    def close(self) -> None:
        if self._loop is None:
            return
        asyncio.run_coroutine_threadsafe(self._client.aclose(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._loop = self._client = None

    def _payload(self, request: BenchRequest) -> dict:
        prompt = request.prompt if request.prompt is not None else list(request.prompt_token_ids)
        return {"model": self.options.served_model_name or self.options.model, "prompt": prompt,
                "max_tokens": request.output_len, "temperature": 0.0, "stream": True,
                "ignore_eos": True, "stream_options": {"include_usage": True}}

    async def _send(self, request: BenchRequest, arrival_time: float) -> None:
        try:
            record = await self._stream(request, arrival_time)
        except (httpx.HTTPError, ValueError, KeyError) as exc:
            record = failed_record(request, arrival_time, f"{type(exc).__name__}: {exc}")
        self._results.put(record)

    async def _stream(self, request: BenchRequest, arrival_time: float) -> RequestRecord:
        times: list[float] = []
        usage_tokens = None
        async with self._client.stream("POST", self.url, json=self._payload(request)) as resp:
            if resp.status_code != 200:
                body = (await resp.aread()).decode(errors="replace")[:300]
                return failed_record(request, arrival_time, f"HTTP {resp.status_code}: {body}")
            async for line in resp.aiter_lines():
                data = line[len("data:"):].strip() if line.startswith("data:") else ""
                if not data or data == "[DONE]":
                    continue
                chunk = json.loads(data)
                if any(choice.get("text") for choice in chunk.get("choices") or []):
                    times.append(time.monotonic())
                usage_tokens = (chunk.get("usage") or {}).get("completion_tokens", usage_tokens)
        return RequestRecord(request.request_id, request.prompt_len, request.output_len,
                             arrival_time, times, time.monotonic(),
                             None if times else "the stream carried no text", usage_tokens)
