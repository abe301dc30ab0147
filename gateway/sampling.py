"""An OpenAI request body -> ``SamplingParams`` and the scheduler's request arguments, with the
gateway's size limits. Every refusal names the parameter, so the client gets a 400 it can act on."""
from __future__ import annotations

from dataclasses import dataclass

from gateway.config import GatewayConfig
from gateway.errors import APIError
from gateway.protocol import ChatCompletionRequest, CompletionRequest, SamplingFields
from lenserve_contract.errors import InvalidRequestError
from lenserve_contract.sampling_params import SamplingParams

MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 256


@dataclass(frozen=True)
class Prompt:
    text: str | None = None
    token_ids: list[int] | None = None

    def kwargs(self) -> dict:
        if self.token_ids is not None:
            return {"prompt_token_ids": self.token_ids}
        return {"prompt": self.text}


def bad(param: str, message: str) -> APIError:
    return APIError(400, f"{param}: {message}", param, "invalid_value")


def refuse_unsupported(req: SamplingFields) -> None:
    """Fields whose non-neutral values lenserve does not implement: refused, not ignored."""
    if req.n != 1:
        raise bad("n", "only n=1 is supported; send one request per sample")
    if req.presence_penalty or req.frequency_penalty:
        raise bad("presence_penalty" if req.presence_penalty else "frequency_penalty",
                  "penalties are not supported")
    if req.logit_bias:
        raise bad("logit_bias", "not supported")
    if req.logprobs not in (None, False, 0):
        raise bad("logprobs", "not supported")
    if isinstance(req, CompletionRequest):
        if req.echo or req.suffix:
            raise bad("echo" if req.echo else "suffix", "not supported")
        if req.best_of not in (None, 1):
            raise bad("best_of", "only best_of=1 is supported")
    if isinstance(req, ChatCompletionRequest) and req.tools:
        raise bad("tools", "tool calls are not supported")


def max_tokens(req: SamplingFields, default: int, limit: int) -> int:
    """``max_tokens``, else ``max_completion_tokens``, else the default; each one given is
    checked, so a bad value is refused even where the other one wins."""
    for name in ("max_tokens", "max_completion_tokens"):
        value = getattr(req, name)
        if value is not None and not 1 <= value <= limit:
            raise bad(name, f"must be in [1, {limit}], got {value}")
    value = req.max_completion_tokens if req.max_tokens is None else req.max_tokens
    return default if value is None else value


def stop_strings(stop: str | list[str] | None) -> list[str]:
    stops = [stop] if isinstance(stop, str) else list(stop or [])
    if len(stops) > MAX_STOP_STRINGS or any(not s or len(s) > MAX_STOP_CHARS for s in stops):
        raise bad("stop", f"at most {MAX_STOP_STRINGS} non-empty strings of at most "
                          f"{MAX_STOP_CHARS} characters")
    for s in stops:
        check_text("stop", s)
    return stops


def sampling_params(req: SamplingFields, default_max_tokens: int, limit: int) -> SamplingParams:
    refuse_unsupported(req)
    n = max_tokens(req, default_max_tokens, limit)
    if not 0 <= req.min_tokens <= n:
        raise bad("min_tokens", f"must be in [0, max_tokens={n}], got {req.min_tokens}")
    if req.seed is not None and req.seed < 0:
        raise bad("seed", f"must be >= 0, got {req.seed}")
    try:
        return SamplingParams(
            temperature=1.0 if req.temperature is None else req.temperature,
            top_p=1.0 if req.top_p is None else req.top_p,
            top_k=-1 if req.top_k is None else req.top_k, seed=req.seed, max_tokens=n,
            min_tokens=req.min_tokens, stop=stop_strings(req.stop), ignore_eos=req.ignore_eos)
    except InvalidRequestError as exc:
        raise APIError(400, str(exc), exc.field or None, exc.code) from None


def request_kwargs(req: SamplingFields) -> dict:
    """lenserve's own per-request fields, as the scheduler takes them."""
    kwargs = {"priority": req.priority}
    if req.slo_ms is not None:
        kwargs["slo_deadline_s"] = req.slo_ms / 1000.0
    return kwargs


def check_text(param: str, text: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise bad(param, "is not valid UTF-8 text (lone surrogate)") from None


def completion_prompt(req: CompletionRequest, config: GatewayConfig) -> Prompt:
    prompt = req.prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        if len(prompt) != 1:
            raise bad("prompt", "a list of prompts is not supported; send one request per prompt")
        prompt = prompt[0]
    if len(prompt) > config.max_prompt_len:
        raise bad("prompt", f"is longer than {config.max_prompt_len} "
                            f"{'characters' if isinstance(prompt, str) else 'tokens'}")
    if isinstance(prompt, str):
        check_text("prompt", prompt)
        return Prompt(text=prompt)
    return Prompt(token_ids=list(prompt))
