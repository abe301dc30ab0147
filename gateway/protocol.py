"""Request bodies of the OpenAI API, with vLLM's extensions (``top_k``, ``min_tokens``,
``ignore_eos``) and lenserve's (``priority``, ``slo_ms``). Fields lenserve cannot honour are
accepted only at their neutral value (see ``sampling.refuse_unsupported``); unknown fields are
ignored, as OpenAI's own server does."""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

Int64 = Annotated[int, Field(ge=-(2**63), le=2**63 - 1)]
Finite = Annotated[float, Field(allow_inf_nan=False)]
TokenIds = list[Annotated[int, Field(ge=0, le=2**31)]]


class StreamOptions(BaseModel):
    include_usage: bool = False


class SamplingFields(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    max_tokens: Int64 | None = None
    max_completion_tokens: Int64 | None = None
    temperature: Finite | None = None
    top_p: Finite | None = None
    top_k: Int64 | None = None
    min_tokens: Int64 = 0
    seed: Int64 | None = None
    stop: str | list[str] | None = None
    ignore_eos: bool = False
    n: Int64 = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: Finite | None = None
    frequency_penalty: Finite | None = None
    logit_bias: dict[str, float] | None = None
    logprobs: bool | int | None = None
    user: str | None = None
    # lenserve: the request's priority, handed to the scheduling policy as is; slo_ms is its
    # end-to-end latency target in milliseconds from arrival (the policy's slo_deadline_s).
    priority: Annotated[int, Field(ge=-(2**31), le=2**31 - 1)] = 0
    slo_ms: Annotated[float, Field(gt=0, allow_inf_nan=False)] | None = None


class CompletionRequest(SamplingFields):
    prompt: str | list[str] | TokenIds | list[TokenIds]
    echo: bool = False
    suffix: str | None = None
    best_of: Int64 | None = None


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content)
        return self.content or ""


class ChatCompletionRequest(SamplingFields):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    tools: list[dict] | None = None
    top_logprobs: Int64 | None = None
