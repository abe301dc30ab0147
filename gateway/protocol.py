"""Request bodies of the OpenAI API, with vLLM's extensions (``top_k``, ``min_p``,
``min_tokens``, ``ignore_eos``, ``repetition_penalty``, ``truncate_prompt_tokens``) and
lenserve's (``priority``, ``slo_ms``, ``cap_max_tokens``). Fields lenserve cannot honour are
accepted only at their neutral value (see ``sampling.refuse_unsupported``); unknown fields are
ignored, as OpenAI's own server does.

``documented`` adds to the OpenAPI schema the limits ``gateway.sampling`` checks (with its
own messages), so that a client, or a fuzzer, reading the schema knows what is accepted; the
limits set by the gateway's config are filled in by ``gateway.openapi``. Types are strict, as
the schema states them: ``"stream": 0`` or ``"max_tokens": "16"`` is a 400, not coerced."""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from lenserve_contract.sampling_params import MAX_N

Int64 = Annotated[int, Field(ge=-(2**63), le=2**63 - 1)]


def documented(default=None, **schema):
    """A field whose OpenAPI schema carries ``schema`` (JSON Schema keywords that apply to the
    value whichever of its types it has); validation is left to ``gateway.sampling``."""
    return Field(default, json_schema_extra=schema)


def one_prompt(schema: dict) -> None:
    """``prompt``: a non-empty text or token list, or a list holding exactly one of them."""
    for branch in schema.get("anyOf", ()):
        items = branch.get("items", {})
        if branch.get("type") == "string":
            branch["minLength"] = 1
        elif items.get("type") == "integer":
            branch["minItems"] = 1
        elif branch.get("type") == "array":
            branch["minItems"] = branch["maxItems"] = 1
            if items.get("type") == "string":
                items["minLength"] = 1
            else:
                items["minItems"] = 1


Finite = Annotated[float, Field(allow_inf_nan=False)]
TokenIds = list[Annotated[int, Field(ge=0, le=2**31)]]


STRICT = ConfigDict(extra="ignore", strict=True)
MAX_LOGIT_BIAS_ENTRIES = 300        # OpenAI's limit
MAX_LOGPROBS = 20
MAX_TOOLS = 128                     # OpenAI's limit


class JsonSchemaFormat(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True, populate_by_name=True)

    name: str = "response"
    description: str | None = None
    json_schema: dict | None = Field(None, alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    """OpenAI's ``response_format``: plain text, any JSON object, or JSON following a
    schema (always strictly here, whatever ``strict`` says)."""

    model_config = STRICT

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StreamOptions(BaseModel):
    model_config = STRICT

    include_usage: bool = False


class SamplingFields(BaseModel):
    model_config = STRICT

    model: str | None = None
    max_tokens: Int64 | None = documented(minimum=1)
    max_completion_tokens: Int64 | None = documented(minimum=1)
    temperature: Finite | None = documented(minimum=0)
    top_p: Finite | None = documented(exclusiveMinimum=0, maximum=1)
    top_k: Int64 | None = documented(minimum=-1)          # -1: off
    min_tokens: Int64 = documented(0, minimum=0)          # and at most max_tokens
    seed: Int64 | None = documented(minimum=0)
    stop: str | list[str] | None = documented(
        minLength=1, maxLength=256, maxItems=16, items={"minLength": 1, "maxLength": 256})
    ignore_eos: bool = False
    n: Int64 = documented(1, minimum=1, maximum=MAX_N)     # and at most the server's --max-n
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: Finite | None = documented(minimum=-2, maximum=2)
    frequency_penalty: Finite | None = documented(minimum=-2, maximum=2)
    repetition_penalty: Finite | None = documented(exclusiveMinimum=0, maximum=2)
    min_p: Finite | None = documented(minimum=0, maximum=1)
    # Token id (as a string, OpenAI's form) -> value added to its logit.
    logit_bias: dict[str, Finite] | None = documented(
        maxProperties=MAX_LOGIT_BIAS_ENTRIES, propertyNames={"pattern": "^[0-9]{1,9}$"},
        additionalProperties={"minimum": -100, "maximum": 100})
    response_format: ResponseFormat | None = None
    # vLLM: keep the prompt's last k tokens (-1: as many as leave room for max_tokens).
    truncate_prompt_tokens: Int64 | None = documented(minimum=-1, **{"not": {"const": 0}})
    # lenserve: lower max_tokens to what fits beside the prompt instead of refusing.
    cap_max_tokens: bool = False
    user: str | None = None
    # lenserve: the request's priority, handed to the scheduling policy as is; slo_ms is its
    # end-to-end latency target in milliseconds from arrival (the policy's slo_deadline_s).
    priority: Annotated[int, Field(ge=-(2**31), le=2**31 - 1)] = 0
    slo_ms: Annotated[float, Field(gt=0, allow_inf_nan=False)] | None = None


class CompletionRequest(SamplingFields):
    prompt: str | list[str] | TokenIds | list[TokenIds] = Field(json_schema_extra=one_prompt)
    # How many most likely tokens to report beside each sampled one (OpenAI allows 5).
    logprobs: Int64 | None = documented(minimum=0, maximum=MAX_LOGPROBS)
    echo: bool = documented(False, **{"const": False})
    suffix: str | None = documented(maxLength=0)
    best_of: Int64 | None = documented(minimum=1, maximum=1)


class TextPart(BaseModel):
    model_config = STRICT

    type: Literal["text"]
    text: str


class FunctionDef(BaseModel):
    """A tool's function: ``parameters`` is the JSON schema of its arguments (an object)."""

    model_config = STRICT

    name: str = documented(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str | None = None
    parameters: dict | None = None
    strict: bool | None = None


class ToolDef(BaseModel):
    model_config = STRICT

    type: Literal["function"]
    function: FunctionDef


class FunctionName(BaseModel):
    model_config = STRICT

    name: str


class NamedToolChoice(BaseModel):
    model_config = STRICT

    type: Literal["function"]
    function: FunctionName


class CalledFunction(BaseModel):
    model_config = STRICT

    name: str
    arguments: str          # a JSON object, as text


class ToolCall(BaseModel):
    """A call an earlier assistant turn made (sent back with the tool's answer)."""

    model_config = STRICT

    id: str
    type: Literal["function"] = "function"
    function: CalledFunction


class ChatMessage(BaseModel):
    model_config = STRICT

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None      # an assistant turn's calls
    tool_call_id: str | None = None               # a tool turn: the call it answers

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content)
        return self.content or ""


class ChatCompletionRequest(SamplingFields):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    tools: list[ToolDef] | None = documented(maxItems=MAX_TOOLS)
    # Default: "auto" with tools, "none" without.
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    logprobs: bool | None = None
    top_logprobs: Int64 | None = documented(minimum=0, maximum=MAX_LOGPROBS)
