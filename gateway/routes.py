"""The endpoints. Each completion request: admission check, parameters, then one
``Generation``, returned whole or streamed as server-sent events."""
from __future__ import annotations

import asyncio
import logging

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse, PlainTextResponse, Response

from gateway import tools
from gateway.errors import APIError, error_body
from gateway.failures import failure
from gateway.generation import Generation
from gateway.openapi import COMPLETION, GUARDED, METRICS
from gateway.protocol import ChatCompletionRequest, CompletionRequest, SamplingFields
from gateway.responses import DONE, ChatShape, CompletionShape, EventStream, client_left, sse
from gateway.sampling import Prompt, completion_prompt, request_kwargs, sampling_params

log = logging.getLogger(__name__)
PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"
CLIENT_CLOSED_REQUEST = 499     # no one reads it; it is what the access log shows

router = APIRouter()


@router.post("/v1/completions", responses=COMPLETION)
async def completions(body: CompletionRequest, request: Request):
    state = request.app.state
    prompt = completion_prompt(body, state.config)
    return await serve(request, body, prompt, CompletionShape, state.config.default_max_tokens)


@router.post("/v1/chat/completions", responses=COMPLETION)
async def chat_completions(body: ChatCompletionRequest, request: Request):
    state = request.app.state
    tool_plan = tools.plan(body)
    prompt = state.chat.render(body.messages, state.config,
                               tool_plan.template_tools() if tool_plan else None)
    return await serve(request, body, prompt, ChatShape, state.config.default_chat_max_tokens,
                       tool_plan)


@router.get("/v1/models", responses=GUARDED)
async def models(request: Request):
    config = request.app.state.config
    card = {"id": config.served_model_name, "object": "model", "created": 0,
            "owned_by": "lenserve"}
    return {"object": "list", "data": [card]}


@router.get("/health")
async def health():
    return {"status": "ok"}


@router.get("/metrics", response_class=PlainTextResponse, responses=METRICS)
async def metrics(request: Request):
    state = request.app.state
    try:
        stats = await state.backend.stats()
    except Exception:  # the gateway's own metrics are still worth a scrape
        log.warning("stats() failed during a scrape", exc_info=True)
        stats = None
    return Response(state.metrics.render(stats), media_type=PROMETHEUS_TEXT)


async def serve(request: Request, body: SamplingFields, prompt: Prompt, shape_cls,
                default_max_tokens: int, tool_plan: tools.ToolPlan | None = None) -> Response:
    state, config = request.app.state, request.app.state.config
    endpoint = request.url.path
    try:
        check_model(body, config.served_model_name)
        params = sampling_params(body, default_max_tokens, config.max_tokens_limit,
                                 config.max_n)
        if not state.admission.admit():
            state.metrics.rejected.labels("queue_full").inc()
            raise APIError(429, "the scheduler's queue is full; retry later", code="queue_full",
                           headers={"Retry-After": str(config.retry_after_s)})
        gen = await Generation.start(state.backend, state.metrics, prompt, params,
                                     request_kwargs(body), shape_cls.prefix)
    except APIError as err:
        state.metrics.requests.labels(endpoint, str(err.status)).inc()
        raise
    shape = shape_cls(config.served_model_name, gen.request_id, state.token_names)
    if tool_plan is not None:
        shape.tool_plan = tool_plan
    state.metrics.requests.labels(endpoint, "200").inc()
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return EventStream(stream(gen, shape, include_usage, params.n),
                           headers={"Cache-Control": "no-cache"})
    return await whole(gen, shape, request, params.n)


def check_model(body: SamplingFields, served: str) -> None:
    if body.model is not None and body.model != served:
        raise APIError(404, f"model {body.model!r} does not exist; this server serves "
                            f"{served!r}", "model", "model_not_found")


async def whole(gen: Generation, shape: CompletionShape, request: Request,
                n: int = 1) -> Response:
    """The whole answer, or nothing if the client leaves first: the server does not cancel a
    handler whose client went away, so the disconnect is watched here and ends the request
    upstream (``Generation.deltas`` aborts a request dropped before its end)."""
    collect = asyncio.ensure_future(_collect(gen))
    left = asyncio.ensure_future(client_left(request.receive))
    await asyncio.wait((collect, left), return_when=asyncio.FIRST_COMPLETED)
    if not collect.done():
        collect.cancel()
        await asyncio.gather(collect, return_exceptions=True)
        log.info("client left before request %s finished; aborted", gen.request_id)
        return Response(status_code=CLIENT_CLOSED_REQUEST)
    left.cancel()
    try:
        parts = collect.result()
    except Exception as exc:  # noqa: BLE001 - the scheduler failed mid-request
        raise failure(exc, gen.request_id) from None
    choices = [(i, "".join(parts.get(i, ())), gen.finish_reasons.get(i, "stop"),
                gen.logprobs.get(i)) for i in range(n)]
    return JSONResponse(shape.full(choices, gen.usage()))


async def _collect(gen: Generation) -> dict[int, list[str]]:
    parts: dict[int, list[str]] = {}
    async for deltas in gen.deltas():
        for d in deltas:
            parts.setdefault(d.index, []).append(d.text)
    return parts


async def stream(gen: Generation, shape: CompletionShape, include_usage: bool, n: int):
    opening = shape.opening(n)
    if opening is not None:
        yield sse(opening)
    try:
        async for deltas in gen.deltas():
            for d in deltas:
                if d.text or d.finish_reason or d.logprobs:
                    event = shape.event(d.text, d.finish_reason, d.logprobs, d.index)
                    if event:   # text held back (a tool call may be starting) sends nothing
                        yield event
    except Exception as exc:  # noqa: BLE001 - headers are gone; say it in the stream
        err = failure(exc, gen.request_id)
        yield sse(error_body(err.status, err.message, code=err.code))
    if include_usage:
        yield sse(shape.usage_chunk(gen.usage()))
    yield DONE
