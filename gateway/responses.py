"""Response bodies and SSE chunks of ``/v1/completions`` and ``/v1/chat/completions``."""
from __future__ import annotations

import json
import time

DONE = b"data: [DONE]\n\n"


def sse(obj: dict) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


class CompletionShape:
    """``text_completion`` objects; subclasses change the choice layout."""

    prefix, object, chunk_object = "cmpl", "text_completion", "text_completion"

    def __init__(self, model: str, request_id: str):
        self.model, self.id, self.created = model, request_id, int(time.time())

    def envelope(self, obj: str, choices: list, usage: dict | None) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model,
                "choices": choices, "usage": usage}

    def full(self, text: str, finish_reason: str | None, usage: dict) -> dict:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        return self.envelope(self.object, [choice], usage)

    def chunk(self, text: str, finish_reason: str | None) -> dict:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        return self.envelope(self.chunk_object, [choice], None)

    def opening(self) -> dict | None:
        return None

    def usage_chunk(self, usage: dict) -> dict:
        return self.envelope(self.chunk_object, [], usage)


class ChatShape(CompletionShape):
    prefix, object, chunk_object = "chatcmpl", "chat.completion", "chat.completion.chunk"

    def full(self, text: str, finish_reason: str | None, usage: dict) -> dict:
        choice = {"index": 0, "message": {"role": "assistant", "content": text},
                  "logprobs": None, "finish_reason": finish_reason}
        return self.envelope(self.object, [choice], usage)

    def chunk(self, text: str, finish_reason: str | None) -> dict:
        delta = {"content": text} if text else {}
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        return self.envelope(self.chunk_object, [choice], None)

    def opening(self) -> dict:
        choice = {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                  "finish_reason": None}
        return self.envelope(self.chunk_object, [choice], None)
