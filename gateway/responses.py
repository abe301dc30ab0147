"""Response bodies and SSE chunks of ``/v1/completions`` and ``/v1/chat/completions``, and
the response that streams them."""
from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from gateway.logprobs import TokenNames, chat_logprobs, completion_logprobs

DONE = b"data: [DONE]\n\n"
_encode = json.JSONEncoder(separators=(",", ":")).encode
_TEXT_MARK, _REASON_MARK = "\x00text", "\x00finish_reason"   # never in the envelope


def sse(obj: dict) -> bytes:
    return b"data: " + _encode(obj).encode() + b"\n\n"


class EventStream(Response):
    """Server-sent events from an async iterator of bytes, ended early when the client leaves.

    Starlette's ``StreamingResponse`` does the same under an anyio task group (cancel scopes
    and task-group bookkeeping on every request); here the events are sent from one plain
    task and a second one waits for the disconnect. Leaving cancels the sender, so the
    iterator is closed at the event it was waiting for (and the generation behind it is
    aborted upstream). With ``CompletionShape.event`` this took the gateway's own time to the
    first event to 0.83-0.89x, and to the end of an 8-token stream to 0.76-0.81x, of what it
    was (``evaluation/gateway/overhead.py --app-only``, 4 alternating pairs, 2-core CPU)."""

    media_type = "text/event-stream"

    def __init__(self, events: AsyncIterator[bytes], headers: dict[str, str] | None = None):
        self.events = events
        self.status_code = 200
        self.background = None
        self.init_headers(headers)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        sender = asyncio.ensure_future(self._send_all(send))
        watcher = asyncio.ensure_future(client_left(receive))
        try:
            await asyncio.wait((sender, watcher), return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (sender, watcher):
                task.cancel()
            await asyncio.gather(sender, watcher, return_exceptions=True)
        if sender.done() and not sender.cancelled() and sender.exception() is not None:
            raise sender.exception()

    async def _send_all(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code,
                    "headers": self.raw_headers})
        try:
            async for event in self.events:
                await send({"type": "http.response.body", "body": event, "more_body": True})
        finally:
            await self.events.aclose()
        await send({"type": "http.response.body", "body": b"", "more_body": False})


async def client_left(receive: Receive) -> None:
    """Returns once the client has disconnected (the body was read already, so the next
    message the server has for this request is the disconnect)."""
    while (await receive())["type"] != "http.disconnect":
        pass


class CompletionShape:
    """``text_completion`` objects; subclasses change the choice layout. A request with
    ``n > 1`` has a choice per ``index``: whole, all of them; streamed, a chunk per choice
    that changed."""

    prefix, object, chunk_object = "cmpl", "text_completion", "text_completion"

    def __init__(self, model: str, request_id: str, names: TokenNames | None = None):
        self.model, self.id, self.created = model, request_id, int(time.time())
        self._frame: tuple[bytes, ...] | None = None
        self.names = names or TokenNames()
        # Per choice, characters of the tokens whose logprobs were sent.
        self._offsets: dict[int, int] = {}

    def logprobs(self, entries: list | None, index: int = 0):
        if entries is None:
            return None
        out = completion_logprobs(entries, self.names, self._offsets.get(index, 0))
        if out["tokens"]:
            self._offsets[index] = out["text_offset"][-1] + len(out["tokens"][-1])
        return out

    def envelope(self, obj: str, choices: list, usage: dict | None) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model,
                "choices": choices, "usage": usage}

    def full(self, choices: list, usage: dict) -> dict:
        """``choices``: (index, whole text, finish reason, every logprob or None) each."""
        return self.envelope(self.object, [self.choice(*c) for c in choices], usage)

    def choice(self, index: int, text: str, finish_reason: str | None,
               logprobs: list | None) -> dict:
        return {"index": index, "text": text, "logprobs": self.logprobs(logprobs, index),
                "finish_reason": finish_reason}

    def chunk(self, text: str, finish_reason: str | None, logprobs: list | None = None,
              index: int = 0) -> dict:
        return self.envelope(self.chunk_object,
                             [self.choice(index, text, finish_reason, logprobs)], None)

    def event(self, text: str, finish_reason: str | None, logprobs: list | None = None,
              index: int = 0) -> bytes:
        """``sse(self.chunk(text, finish_reason, logprobs, index))``, with the envelope
        encoded once per request: only the text and the finish reason are encoded per token
        (of choice 0: another choice, or logprobs, encode the whole chunk)."""
        if logprobs is not None or index:
            return sse(self.chunk(text, finish_reason, logprobs, index))
        if self._frame is None:
            framed = sse(self.chunk(_TEXT_MARK, _REASON_MARK))
            text_mark, reason_mark = _encode(_TEXT_MARK).encode(), _encode(_REASON_MARK).encode()
            self._frame = ()      # a name holding a mark: the envelope is encoded whole
            if framed.count(text_mark) == framed.count(reason_mark) == 1:
                head, rest = framed.split(text_mark)
                self._frame = (head, *rest.split(reason_mark))
        if not text or not self._frame:
            return sse(self.chunk(text, finish_reason))
        head, middle, tail = self._frame
        return b"".join((head, _encode(text).encode(), middle,
                         _encode(finish_reason).encode(), tail))

    def opening(self, n: int = 1) -> dict | None:
        return None

    def usage_chunk(self, usage: dict) -> dict:
        return self.envelope(self.chunk_object, [], usage)


class ChatShape(CompletionShape):
    prefix, object, chunk_object = "chatcmpl", "chat.completion", "chat.completion.chunk"
    tool_plan = None      # a ``gateway.tools.ToolPlan`` when the request has tools

    def __init__(self, model: str, request_id: str, names: TokenNames | None = None):
        super().__init__(model, request_id, names)
        self._tool_parsers: dict = {}   # per choice index, with tools

    def logprobs(self, entries: list | None, index: int = 0):
        return None if entries is None else chat_logprobs(entries, self.names)

    def choice(self, index: int, text: str, finish_reason: str | None,
               logprobs: list | None) -> dict:
        message = {"role": "assistant", "content": text}
        parser = self._tool_parser(index)
        if parser is not None:
            head = parser.feed(text)
            rest, calls = parser.finish()
            message["content"] = (head + rest) or (None if calls else "")
            if calls:
                message["tool_calls"], finish_reason = calls, "tool_calls"
        return {"index": index, "message": message, "logprobs": self.logprobs(logprobs),
                "finish_reason": finish_reason}

    def chunk(self, text: str, finish_reason: str | None, logprobs: list | None = None,
              index: int = 0, tool_calls: list | None = None) -> dict:
        delta = {"content": text} if text else {}
        if tool_calls:
            delta["tool_calls"] = tool_calls
        choice = {"index": index, "delta": delta, "logprobs": self.logprobs(logprobs),
                  "finish_reason": finish_reason}
        return self.envelope(self.chunk_object, [choice], None)

    def event(self, text: str, finish_reason: str | None, logprobs: list | None = None,
              index: int = 0) -> bytes:
        parser = self._tool_parser(index)
        if parser is None:
            return super().event(text, finish_reason, logprobs, index)
        content = parser.feed(text)
        if finish_reason is None:
            return (sse(self.chunk(content, None, logprobs, index)) if content or logprobs
                    else b"")
        rest, calls = parser.finish()
        text = content + rest
        events = [sse(self.chunk(text, None, logprobs, index))] if text or logprobs else []
        events += [sse(self.chunk("", None, None, index, [{"index": i, **call}]))
                   for i, call in enumerate(calls)]
        events.append(sse(self.chunk("", "tool_calls" if calls else finish_reason, None, index)))
        return b"".join(events)

    def _tool_parser(self, index: int):
        """The choice's ``gateway.tools.ToolCallParser`` (one per choice), or None without
        tools."""
        if self.tool_plan is None:
            return None
        if index not in self._tool_parsers:
            self._tool_parsers[index] = self.tool_plan.parser()
        return self._tool_parsers[index]

    def opening(self, n: int = 1) -> dict:
        """The role, for every choice."""
        choices = [{"index": i, "delta": {"role": "assistant", "content": ""},
                    "logprobs": None, "finish_reason": None} for i in range(n)]
        return self.envelope(self.chunk_object, choices, None)
