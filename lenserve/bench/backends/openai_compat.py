"""``openai:<url>``: any OpenAI-compatible server, through streaming ``/v1/completions``.

Requests are sent as in ``vllm bench serve``: ``stream: true``, ``ignore_eos``, ``max_tokens``
set to the request's output length. Each streamed chunk that carries text is timed on
arrival; the token count comes from the final ``usage`` when the server sends it. Over HTTP
``max_tokens`` is the only way to force a length, so a lenserve server running a length-aware
policy sees each reply's true length as its cap and can trim its predictions with it: compare
policies through the in-process ``lenserve:`` backends or ``lenserve simulate``, which end a
reply at its length without telling the policy (``base.trace_params``).

Plain ``http://`` URLs are read by this module's own small HTTP/1.1 client (an asyncio
protocol over httptools, the C parser uvicorn uses; one connection per request). The client
shares the machine with the server it measures, and httpx's pure-Python streaming took 3-5x
its CPU per streamed event (66-85 against 18-25 us; 50 concurrent streams of 100 tokens from
``lenserve up --model fake``). ``https://`` URLs go through httpx.
"""
from __future__ import annotations

import asyncio
import json
import queue
import threading
import time

import httptools
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
        stream = self._stream_plain if self.url.startswith("http://") else self._stream
        try:        # the timeout bounds the whole request, on either path
            record = await asyncio.wait_for(stream(request, arrival_time),
                                            self.options.request_timeout_s)
        except (httpx.HTTPError, OSError, ValueError, KeyError,
                httptools.HttpParserError, asyncio.TimeoutError) as exc:
            record = failed_record(request, arrival_time,
                                   f"{type(exc).__name__}: {exc}".rstrip(": "))
        self._results.put(record)

    async def _stream(self, request: BenchRequest, arrival_time: float) -> RequestRecord:
        events = _Events()
        async with self._client.stream("POST", self.url, json=self._payload(request)) as resp:
            if resp.status_code != 200:
                body = (await resp.aread()).decode(errors="replace")[:300]
                return failed_record(request, arrival_time, f"HTTP {resp.status_code}: {body}")
            async for line in resp.aiter_lines():
                if line.startswith("data:"):
                    events.event(line[len("data:"):], time.monotonic())
        return events.record(request, arrival_time)

    async def _stream_plain(self, request: BenchRequest, arrival_time: float) -> RequestRecord:
        url = httpx.URL(self.url)
        body = json.dumps(self._payload(request)).encode()
        head = (f"POST {url.raw_path.decode()} HTTP/1.1\r\nHost: {url.netloc.decode()}\r\n"
                f"Content-Type: application/json\r\nAccept: text/event-stream\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n")
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        transport, stream = await loop.create_connection(
            lambda: _SSEResponse(head.encode() + body, done), url.host, url.port or 80)
        try:
            await done
        finally:
            transport.close()
        if stream.status != 200:
            text = bytes(stream.buffer).decode(errors="replace")[:300]
            return failed_record(request, arrival_time, f"HTTP {stream.status}: {text}")
        return stream.events.record(request, arrival_time)


class _Events:
    """The events of one streamed completion: when each chunk with text came, the last usage."""

    def __init__(self):
        self.times: list[float] = []
        self.usage_tokens: int | None = None

    def event(self, data: str | bytes, now: float) -> None:
        data = data.strip()
        if not data or data in ("[DONE]", b"[DONE]"):
            return
        chunk = json.loads(data)
        if any(choice.get("text") for choice in chunk.get("choices") or []):
            self.times.append(now)
        self.usage_tokens = (chunk.get("usage") or {}).get("completion_tokens", self.usage_tokens)

    def record(self, request: BenchRequest, arrival_time: float) -> RequestRecord:
        return RequestRecord(request.request_id, request.prompt_len, request.output_len,
                             arrival_time, self.times, time.monotonic(),
                             None if self.times else "the stream carried no text",
                             self.usage_tokens)


class _SSEResponse(asyncio.Protocol):
    """One request written on connect; the response parsed as it arrives. ``done`` is set when
    the response has ended (a bad status included), or fails when the connection or the parser
    does. Events are timed when the bytes that end them were read."""

    def __init__(self, request: bytes, done: asyncio.Future):
        self.request, self.done = request, done
        self.parser = httptools.HttpResponseParser(self)
        self.events = _Events()
        self.status: int | None = None
        self.buffer = bytearray()
        self.framed = False          # Content-Length or chunked: the end is in the bytes
        self.now = 0.0

    def connection_made(self, transport) -> None:
        transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        self.now = time.monotonic()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:      # a callback's error (bad JSON) is inside
            self._fail(exc.__context__ if isinstance(exc.__context__, ValueError) else exc)

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name == b"content-length" or (name == b"transfer-encoding" and b"chunked" in value):
            self.framed = True

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        self.buffer += body
        if self.status != 200:
            return
        *events, rest = self.buffer.replace(b"\r\n", b"\n").split(b"\n\n")
        self.buffer = bytearray(rest)
        for event in events:
            for line in event.split(b"\n"):
                if line.startswith(b"data:"):
                    self.events.event(line[len(b"data:"):], self.now)

    def on_message_complete(self) -> None:
        if self.status == 200 and self.buffer.strip():
            self.on_body(b"\n\n")
        if not self.done.done():
            self.done.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.status is not None and not self.framed:
            self.on_message_complete()          # HTTP/1.0-style: the body ends at EOF
        self._fail(exc or ConnectionError("the server closed the connection mid-response"))

    def _fail(self, exc: Exception) -> None:
        if not self.done.done():
            self.done.set_exception(exc)
