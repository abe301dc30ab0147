"""What the OpenAPI schema (``/openapi.json``) says the endpoints answer: the statuses they
really return, each error in OpenAI's shape, SSE next to JSON where ``stream`` is allowed,
Prometheus text for ``/metrics``. FastAPI's default 422 is dropped: a body that does not
validate is a 400 here, as with OpenAI. The request bodies carry this gateway's limits
(``max_tokens``, ``n``, prompt length) besides the fixed ones of ``gateway.protocol``."""
from __future__ import annotations

from pydantic import BaseModel

from gateway.guard import OPEN_PATHS


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(BaseModel):
    error: ErrorDetail


def errors(*statuses: int) -> dict:
    text = {400: "invalid request (the message names the parameter)",
            401: "invalid or missing API key (only when keys are configured)",
            404: "the model named is not the one served",
            405: "method not allowed",
            413: "request body larger than the limit",
            429: "the admission queue is full; see Retry-After",
            500: "the engine failed the request after it started",
            502: "the scheduler failed the request",
            503: "too many open requests (see Retry-After), or the scheduler is unavailable",
            504: "the scheduler did not answer in time"}
    # Spelled out rather than ``model=``: FastAPI would file it under the route's own media
    # type, which for /metrics is text. The schema is registered by ``ErrorResponse`` below.
    return {status: {"description": text[status], "content": {"application/json": {
        "schema": {"$ref": "#/components/schemas/ErrorResponse"}}}} for status in statuses}


# One server-sent event: ``data:`` a JSON chunk, or ``[DONE]`` at the end.
SSE_EVENT = {"type": "object", "required": ["data"], "properties": {"data": {"type": "string"}}}
# Every path but /health passes the guard: key, body size, open-request bound.
GUARDED = errors(401, 413, 503)
COMPLETION = {
    200: {"description": "the completion, or with `stream` server-sent events ending in "
                         "`data: [DONE]`",
          "content": {"application/json": {}, "text/event-stream": {"schema": SSE_EVENT}}},
    **errors(400, 404, 429, 500, 502, 504), **GUARDED,
}
METRICS = {200: {"description": "Prometheus text exposition",
                 "content": {"text/plain": {"schema": {"type": "string"}}}}, **GUARDED}


def finish_schema(app, config) -> None:
    """Make ``app.openapi()`` leave out FastAPI's 422 answers and their schemas, carry the
    error schema the responses above refer to, and state the limits of ``config``."""
    build = app.openapi

    def openapi() -> dict:
        if app.openapi_schema is None:
            schema = build()
            for operations in schema.get("paths", {}).values():
                for operation in operations.values():
                    operation.get("responses", {}).pop("422", None)
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            error = ErrorResponse.model_json_schema(ref_template="#/components/schemas/{model}")
            components.update(error.pop("$defs", {}), ErrorResponse=error)
            for name in ("CompletionRequest", "ChatCompletionRequest"):
                state_limits(components[name]["properties"], config)
            if config.api_keys:
                require_bearer(schema)
            for name in ("HTTPValidationError", "ValidationError"):
                components.pop(name, None)
        return app.openapi_schema
    app.openapi = openapi


def require_bearer(schema: dict) -> None:
    """With API keys configured, every path but /health wants ``Authorization: Bearer``."""
    schema["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
    for path, operations in schema.get("paths", {}).items():
        if path not in OPEN_PATHS:
            for operation in operations.values():
                operation["security"] = [{"bearer": []}]


def state_limits(properties: dict, config) -> None:
    for name in ("max_tokens", "max_completion_tokens"):
        properties[name]["maximum"] = config.max_tokens_limit
    properties["n"]["maximum"] = config.max_n
    for branch in properties.get("prompt", {}).get("anyOf", ()):
        if branch.get("type") == "string":
            branch["maxLength"] = config.max_prompt_len
        elif branch["items"].get("type") == "integer":
            branch["maxItems"] = config.max_prompt_len
        elif branch["items"].get("type") == "string":
            branch["items"]["maxLength"] = config.max_prompt_len
        else:
            branch["items"]["maxItems"] = config.max_prompt_len
