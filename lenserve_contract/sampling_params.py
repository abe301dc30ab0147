"""Sampling parameters, with vLLM's names and defaults.

Beyond temperature / top-k / top-p: ``logprobs`` (how many most likely alternatives to report
beside each sampled token's own log-probability; None reports nothing), the OpenAI penalties
(``presence_penalty`` and ``frequency_penalty`` on the output tokens, in [-2, 2]) and vLLM's
``repetition_penalty`` (on prompt and output tokens, > 0, 1 = off), ``min_p``, ``logit_bias``
(token id -> value added to its logit, in [-100, 100]), a per-request ``seed``, structured
output (``StructuredOutput``: a JSON object, or JSON that follows a schema) and
``truncate_prompt_tokens``: a prompt whose length plus ``max_tokens`` exceeds the context is
refused (as vLLM does) unless the request opts into one of two truncations:
``truncate_prompt_tokens`` keeps only the prompt's last tokens (``k > 0``: at most ``k``, as
vLLM; ``-1``: as many as leave room for ``max_tokens``), ``cap_max_tokens`` lowers
``max_tokens`` to what fits beside the prompt (the output then ends with ``length`` at the
context limit).

``n`` (parallel sampling) asks for that many independent samples of one prompt: the engine
prefills the prompt once and runs ``n`` sequences on its shared KV blocks (at most
``MAX_N``; a front may bound it lower)."""
from __future__ import annotations

from dataclasses import dataclass, field

from lenserve_contract.errors import InvalidRequestError

__all__ = ["MAX_LOGPROBS", "MAX_N", "InvalidRequestError", "SamplingParams", "StructuredOutput"]

MAX_LOGPROBS = 20          # as vLLM's default max_logprobs and OpenAI's top_logprobs limit
MAX_LOGIT_BIAS = 100.0     # OpenAI's range for a logit_bias value
MAX_PENALTY = 2.0          # OpenAI's range for presence / frequency penalties
MAX_N = 128                # samples per request (OpenAI's limit for chat completions)


@dataclass(frozen=True)
class StructuredOutput:
    """Constrain the output: ``kind`` "json_object" (any JSON object) or "json_schema"
    (``schema``, JSON text, followed strictly)."""

    kind: str
    schema: str = ""

    def __post_init__(self) -> None:
        if self.kind not in ("json_object", "json_schema"):
            raise InvalidRequestError(f"structured output kind must be json_object or "
                                      f"json_schema, got {self.kind!r}", field="response_format")
        if self.kind == "json_schema" and not self.schema:
            raise InvalidRequestError("json_schema needs a schema", field="response_format")


@dataclass
class SamplingParams:
    temperature: float = 1.0
    top_k: int = -1
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = None
    max_tokens: int = 16
    min_tokens: int = 0
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    # False: token ids only, no text (vLLM's name); benchmarks that count tokens skip the
    # per-token detokenizing cost. Stop strings need text, so they need it on.
    detokenize: bool = True
    logprobs: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] = field(default_factory=dict)
    structured_output: StructuredOutput | None = None
    truncate_prompt_tokens: int | None = None
    cap_max_tokens: bool = False
    n: int = 1

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.verify()

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def penalized(self) -> bool:
        return bool(self.presence_penalty or self.frequency_penalty
                    or self.repetition_penalty != 1.0)

    @property
    def needs_history(self) -> bool:
        """The sampler must know the request's earlier tokens (penalties, a grammar)."""
        return self.penalized or self.structured_output is not None

    @property
    def plain(self) -> bool:
        """Nothing beyond temperature, top-k and top-p: the sampler's fast path."""
        return not (self.needs_history or self.logit_bias or self.min_p
                    or self.logprobs is not None)

    def verify(self) -> None:
        """Raise InvalidRequestError naming the first bad parameter."""
        # The executor verifies every sequence of every iteration: the common case builds no
        # messages.
        if (self.temperature >= 0.0 and (self.top_k == -1 or self.top_k >= 0)
                and 0.0 < self.top_p <= 1.0 and 0 <= self.min_tokens <= self.max_tokens
                and self.max_tokens >= 1 and all(isinstance(s, str) and s for s in self.stop)
                and (self.detokenize or not self.stop) and self.plain
                and self.truncate_prompt_tokens is None and self.n == 1):
            return
        for ok, name, why in self._checks():
            if not ok:
                raise InvalidRequestError(f"invalid sampling parameter {name}: {why}", field=name)

    def _checks(self) -> list[tuple[bool, str, str]]:
        trunc = self.truncate_prompt_tokens
        return [
            (self.temperature >= 0.0, "temperature", f"must be >= 0, got {self.temperature}"),
            (self.top_k == -1 or self.top_k >= 0, "top_k", f"must be -1 (off) or >= 0, got {self.top_k}"),
            (0.0 < self.top_p <= 1.0, "top_p", f"must be in (0, 1], got {self.top_p}"),
            (0.0 <= self.min_p <= 1.0, "min_p", f"must be in [0, 1], got {self.min_p}"),
            (self.max_tokens >= 1, "max_tokens", f"must be >= 1, got {self.max_tokens}"),
            (0 <= self.min_tokens <= self.max_tokens, "min_tokens",
             f"must be in [0, max_tokens], got {self.min_tokens}"),
            (all(isinstance(s, str) and s for s in self.stop), "stop", "stop strings must be non-empty"),
            (self.detokenize or not self.stop, "stop", "stop strings need detokenize=True"),
            (self.logprobs is None or 0 <= self.logprobs <= MAX_LOGPROBS, "logprobs",
             f"must be in [0, {MAX_LOGPROBS}], got {self.logprobs}"),
            (-MAX_PENALTY <= self.presence_penalty <= MAX_PENALTY, "presence_penalty",
             f"must be in [-2, 2], got {self.presence_penalty}"),
            (-MAX_PENALTY <= self.frequency_penalty <= MAX_PENALTY, "frequency_penalty",
             f"must be in [-2, 2], got {self.frequency_penalty}"),
            (0.0 < self.repetition_penalty <= MAX_PENALTY, "repetition_penalty",
             f"must be in (0, 2], got {self.repetition_penalty}"),
            *self._bias_checks(),
            (isinstance(self.n, int) and 1 <= self.n <= MAX_N, "n",
             f"must be an integer in [1, {MAX_N}], got {self.n!r}"),
            (trunc is None or trunc == -1 or trunc >= 1, "truncate_prompt_tokens",
             f"must be -1 (fit the context) or >= 1, got {trunc}"),
        ]

    def _bias_checks(self) -> list[tuple[bool, str, str]]:
        for token, bias in self.logit_bias.items():
            if not isinstance(token, int) or token < 0:
                return [(False, "logit_bias", f"keys must be token ids >= 0, got {token!r}")]
            if not -MAX_LOGIT_BIAS <= bias <= MAX_LOGIT_BIAS:
                return [(False, "logit_bias", f"values must be in [-100, 100], got {bias} "
                                              f"for token {token}")]
        return []

    def check_vocab(self, vocab_size: int) -> None:
        """Token ids the parameters name must exist in the model's vocabulary."""
        for name, ids in (("logit_bias", self.logit_bias), ("stop_token_ids", self.stop_token_ids)):
            bad = [t for t in ids if not 0 <= t < vocab_size]
            if bad:
                raise InvalidRequestError(f"invalid sampling parameter {name}: token id {bad[0]} "
                                          f"is outside the vocabulary [0, {vocab_size})",
                                          field=name)
