"""An OpenAI request body -> ``SamplingParams`` and the scheduler's request arguments, with the
gateway's size limits. Every refusal names the parameter, so the client gets a 400 it can act on."""
from __future__ import annotations

import json
from dataclasses import dataclass

from gateway.config import GatewayConfig
from gateway.errors import APIError
from gateway.protocol import MAX_LOGPROBS, ChatCompletionRequest, CompletionRequest, SamplingFields
from lenserve_contract.errors import InvalidRequestError
from lenserve_contract.sampling_params import SamplingParams, StructuredOutput
from services.executor.structured import check_structured_output

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
    if isinstance(req, CompletionRequest):
        if req.echo or req.suffix:
            raise bad("echo" if req.echo else "suffix", "not supported")
        if req.best_of not in (None, 1):
            raise bad("best_of", "only best_of=1 is supported")


def logprobs(req: SamplingFields) -> int | None:
    """How many top tokens to report: completions' ``logprobs: k``; chat's
    ``logprobs: true`` with ``top_logprobs: k`` (0 without it)."""
    if isinstance(req, ChatCompletionRequest):
        if req.top_logprobs is not None and not req.logprobs:
            raise bad("top_logprobs", "needs logprobs: true")
        top = req.top_logprobs
        value, name = (top or 0) if req.logprobs else None, "top_logprobs"
    else:
        value, name = req.logprobs, "logprobs"
    if value is not None and not 0 <= value <= MAX_LOGPROBS:
        raise bad(name, f"must be in [0, {MAX_LOGPROBS}], got {value}")
    return value


def logit_bias(req: SamplingFields) -> dict[int, float]:
    bias = {}
    for key, value in (req.logit_bias or {}).items():
        if not key.isdigit() or len(key) > 9:
            raise bad("logit_bias", f"keys must be token ids, got {key!r}")
        if not -100 <= value <= 100:
            raise bad("logit_bias", f"values must be in [-100, 100], got {value} for {key}")
        bias[int(key)] = value
    return bias


def structured_output(req: SamplingFields) -> StructuredOutput | None:
    if isinstance(req, ChatCompletionRequest) and req.tools:
        from gateway.tools import plan     # tools.py builds on this module
        tool_plan = plan(req)
        if tool_plan is not None and tool_plan.forced:
            return tool_plan.structured_output()
    fmt = req.response_format
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return StructuredOutput("json_object")
    if fmt.json_schema is None or fmt.json_schema.json_schema is None:
        raise bad("response_format", "json_schema needs json_schema.schema")
    schema = json.dumps(fmt.json_schema.json_schema)
    try:
        check_structured_output("json_schema", schema)
    except InvalidRequestError as exc:
        raise APIError(400, str(exc), "response_format", "invalid_value") from None
    return StructuredOutput("json_schema", schema)


def _range(req: SamplingFields, name: str, low: float, high: float, default: float,
           low_open: bool = False) -> float:
    value = getattr(req, name)
    if value is None:
        return default
    if not (low < value if low_open else low <= value) or value > high:
        interval = f"{'(' if low_open else '['}{low:g}, {high:g}]"
        raise bad(name, f"must be in {interval}, got {value}")
    return value


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


def sampling_params(req: SamplingFields, default_max_tokens: int, limit: int,
                    max_n: int = 1) -> SamplingParams:
    refuse_unsupported(req)
    if not 1 <= req.n <= max_n:
        raise bad("n", f"must be in [1, {max_n}] (this server's --max-n), got {req.n}")
    n = max_tokens(req, default_max_tokens, limit)
    if not 0 <= req.min_tokens <= n:
        raise bad("min_tokens", f"must be in [0, max_tokens={n}], got {req.min_tokens}")
    if req.seed is not None and req.seed < 0:
        raise bad("seed", f"must be >= 0, got {req.seed}")
    trunc = req.truncate_prompt_tokens
    if trunc is not None and not (trunc == -1 or trunc >= 1):
        raise bad("truncate_prompt_tokens", "must be -1 (fit the context) or >= 1")
    # Without a max_tokens of the client's, the gateway's default is a bound, not a demand: it
    # is lowered to fit beside a long prompt (vLLM's default fills the context likewise).
    defaulted = req.max_tokens is None and req.max_completion_tokens is None
    try:
        return SamplingParams(
            temperature=1.0 if req.temperature is None else req.temperature,
            top_p=1.0 if req.top_p is None else req.top_p,
            top_k=-1 if req.top_k is None else req.top_k, seed=req.seed, max_tokens=n,
            min_tokens=req.min_tokens, stop=stop_strings(req.stop), ignore_eos=req.ignore_eos,
            min_p=_range(req, "min_p", 0, 1, 0.0), logprobs=logprobs(req),
            presence_penalty=_range(req, "presence_penalty", -2, 2, 0.0),
            frequency_penalty=_range(req, "frequency_penalty", -2, 2, 0.0),
            repetition_penalty=_range(req, "repetition_penalty", 0, 2, 1.0, low_open=True),
            logit_bias=logit_bias(req), structured_output=structured_output(req),
            truncate_prompt_tokens=req.truncate_prompt_tokens,
            cap_max_tokens=req.cap_max_tokens or defaulted, n=req.n)
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
