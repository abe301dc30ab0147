"""Streamed events: a chunk framed once per request is byte for byte the chunk encoded whole,
and ``EventStream`` sends every event, closes its source, and stops when the client leaves."""
from __future__ import annotations

import asyncio
import json

import pytest
from gateway.responses import ChatShape, CompletionShape, EventStream, sse

TEXTS = ["hi", "", 'quote " backslash \\ newline \n é 中', "\x00text", "\x00finish_reason"]


@pytest.mark.parametrize("shape_cls", [CompletionShape, ChatShape])
@pytest.mark.parametrize("model", ["m", "name with \x00text", "\x00text", "\x00finish_reason"])
def test_a_framed_event_is_the_chunk_encoded_whole(shape_cls, model):
    shape = shape_cls(model, "req-1")
    for text in TEXTS:
        for reason in (None, "stop", "length"):
            event = shape.event(text, reason)
            assert event == sse(shape.chunk(text, reason))
            assert json.loads(event.removeprefix(b"data: "))["id"] == "req-1"


class Source:
    """Events on demand; remembers whether it was closed and where it stopped."""

    def __init__(self, n: int, gate: asyncio.Event | None = None):
        self.n, self.gate, self.sent, self.closed = n, gate, 0, False

    def __aiter__(self):
        return self

    async def __anext__(self) -> bytes:
        if self.sent == self.n:
            raise StopAsyncIteration
        if self.sent > 0 and self.gate is not None:
            await self.gate.wait()
        self.sent += 1
        return f"data: {self.sent}\n\n".encode()

    async def aclose(self):
        self.closed = True


def run(source: Source, disconnect_after: float | None = None):
    sent = []

    async def main():
        async def receive():
            if disconnect_after is None:
                await asyncio.Event().wait()
            await asyncio.sleep(disconnect_after)
            return {"type": "http.disconnect"}

        async def send(message):
            sent.append(message)
        await asyncio.wait_for(EventStream(source)({"type": "http"}, receive, send), 5)
    asyncio.run(main())
    return sent


def test_every_event_is_sent_then_the_body_ends():
    source = Source(3)
    sent = run(source)
    assert sent[0]["type"] == "http.response.start" and sent[0]["status"] == 200
    assert (b"content-type", b"text/event-stream; charset=utf-8") in sent[0]["headers"]
    assert [m["body"] for m in sent[1:]] == [b"data: 1\n\n", b"data: 2\n\n", b"data: 3\n\n", b""]
    assert [m["more_body"] for m in sent[1:]] == [True, True, True, False]
    assert source.closed


def test_a_client_that_leaves_stops_the_stream_and_closes_its_source():
    source = Source(10, gate=asyncio.Event())     # stuck after the first event
    sent = run(source, disconnect_after=0.05)
    assert [m["body"] for m in sent[1:]] == [b"data: 1\n\n"]   # no end of body: nobody reads it
    assert source.sent == 1 and source.closed
