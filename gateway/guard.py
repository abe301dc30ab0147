"""The door, as plain ASGI (no per-request middleware objects): the open-request bound, bearer
API keys, then the body size limit. All answer before the app parses anything, so a client
without a key learns nothing about the request it sent, an oversize body is never held
whole, and overload costs one small JSON answer per refused request.

The open-request bound lives here rather than in uvicorn's ``limit_concurrency``: uvicorn
answers past its limit with a plain-text 503 (and counts idle keep-alive connections too),
where an OpenAI client expects the error JSON."""
from __future__ import annotations

import hmac

from gateway.errors import error_bytes

OPEN_PATHS = frozenset({"/health"})


class Guard:
    def __init__(self, app, api_keys: tuple[str, ...], max_body_bytes: int,
                 max_concurrency: int | None = None, retry_after_s: int = 1):
        self.app = app
        self.keys = tuple(k.encode() for k in api_keys)
        self.max_body_bytes = max_body_bytes
        self.max_open = max_concurrency
        self.retry_after = str(retry_after_s).encode()
        self.num_open = 0
        self.num_refused = 0

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        if self.max_open is None or scope["path"] in OPEN_PATHS:
            return await self._admitted(scope, receive, send)
        if self.num_open >= self.max_open:
            self.num_refused += 1
            return await reply(send, 503, f"the server has {self.max_open} requests open, its "
                               "limit; retry later", "overloaded",
                               [(b"retry-after", self.retry_after), (b"connection", b"close")])
        self.num_open += 1
        try:
            return await self._admitted(scope, receive, send)
        finally:
            self.num_open -= 1

    async def _admitted(self, scope, receive, send):
        if self.keys and scope["path"] not in OPEN_PATHS and not self._authorized(scope):
            return await reply(send, 401, "invalid or missing API key", "invalid_api_key",
                               [(b"www-authenticate", b"Bearer")])
        if self._declared_length(scope) > self.max_body_bytes:
            return await self._too_large(send)
        body = await self._read_body(receive)
        if body is None:
            return await self._too_large(send)
        return await self.app(as_json(scope), replay(body, receive), send)

    def _authorized(self, scope) -> bool:
        header = dict(scope["headers"]).get(b"authorization", b"")
        scheme, _, token = header.partition(b" ")
        if scheme.lower() != b"bearer":
            return False
        token = token.strip()
        # Compared against every key, in constant time, so timing says nothing about them.
        return sum(hmac.compare_digest(token, key) for key in self.keys) > 0

    @staticmethod
    def _declared_length(scope) -> int:
        value = dict(scope["headers"]).get(b"content-length", b"0")
        return int(value) if value.isdigit() else 0

    async def _read_body(self, receive) -> bytes | None:
        """The whole body, or None once it passes the limit."""
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return b"".join(chunks)
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)

    async def _too_large(self, send):
        return await reply(send, 413, f"request body is larger than {self.max_body_bytes} bytes",
                           "request_too_large")


def as_json(scope):
    """Bodies are JSON whatever the Content-Type says (``curl -d`` sends a form type)."""
    if scope["method"] != "POST":
        return scope
    headers = [(k, v) for k, v in scope["headers"] if k != b"content-type"]
    return {**scope, "headers": [*headers, (b"content-type", b"application/json")]}


def replay(body: bytes, receive):
    """A receive that hands the app the body once, then the client's own messages (so a
    disconnect still reaches a streaming response)."""
    sent = False

    async def receive_again():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()
    return receive_again


async def reply(send, status: int, message: str, code: str, headers=()) -> None:
    body = error_bytes(status, message, code=code)
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()), *headers]})
    await send({"type": "http.response.body", "body": body})
