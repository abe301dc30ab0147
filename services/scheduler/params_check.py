"""Checks of a request's sampling parameters that need the served model (its vocabulary,
tokenizer and context), and the prompt truncation a request may opt into. They run when the
request is added, so a bad request is refused (a 400 at the gateway) and never reaches an
iteration other requests share."""
from __future__ import annotations

from lenserve_contract.errors import InvalidRequestError
from lenserve_contract.sampling_params import SamplingParams


def check_params(params: SamplingParams, vocab_size: int, tokenizer) -> None:
    if params.plain:
        return
    params.check_vocab(vocab_size)
    so = params.structured_output
    if so is not None:
        if tokenizer is None or not hasattr(tokenizer, "get_vocab"):
            raise InvalidRequestError("response_format: structured output needs the model's "
                                      "tokenizer, and this engine has none",
                                      field="response_format")
        from services.executor.structured import check_structured_output
        check_structured_output(so.kind, so.schema)


def truncate_prompt(token_ids: list[int], params: SamplingParams,
                    max_model_len: int) -> list[int]:
    """The prompt's last tokens, when the request asked for truncation: at most
    ``truncate_prompt_tokens``, or with ``-1`` as many as leave room for ``max_tokens``."""
    keep = params.truncate_prompt_tokens
    if keep is None:
        return token_ids
    if keep == -1:
        keep = max_model_len - params.max_tokens
        if keep < 1:
            raise InvalidRequestError(
                f"max_tokens ({params.max_tokens}) leaves no room for a prompt in the context "
                f"of {max_model_len} tokens", field="max_tokens", code="context_length_exceeded")
    return token_ids[-keep:] if len(token_ids) > keep else token_ids


def check_length(num_prompt_tokens: int, params: SamplingParams, max_model_len: int) -> None:
    """A prompt plus max_tokens beyond the context is refused, as vLLM does, unless the
    request lets max_tokens be lowered to fit (``cap_max_tokens``)."""
    n = num_prompt_tokens
    if n + params.max_tokens > max_model_len and not params.cap_max_tokens and n < max_model_len:
        raise InvalidRequestError(
            f"this model's maximum context length is {max_model_len} tokens, but the prompt "
            f"({n} tokens) plus max_tokens ({params.max_tokens}) asks for "
            f"{n + params.max_tokens}: lower max_tokens, or opt into truncation "
            "(truncate_prompt_tokens keeps the prompt's last tokens; cap_max_tokens "
            "generates up to the context)", field="max_tokens", code="context_length_exceeded")


_INT_TYPE = frozenset({int})


def prompt_tokens(prompt: str | None, prompt_token_ids: list[int] | None, tokenizer,
                  model_info) -> list[int]:
    """The request's prompt as token ids (tokenized when given as text), checked against the
    vocabulary."""
    if prompt_token_ids is None:
        if prompt is None:
            raise InvalidRequestError("either prompt or prompt_token_ids is required",
                                      field="prompt")
        if not isinstance(prompt, str):
            raise InvalidRequestError(f"prompt must be a string, got {type(prompt).__name__}",
                                      field="prompt")
        if not prompt:
            raise InvalidRequestError("prompt is empty", field="prompt")
        if tokenizer is None:
            raise InvalidRequestError("this engine has no tokenizer; pass prompt_token_ids",
                                      field="prompt")
        return encode(prompt, tokenizer, model_info.eos_token_id)
    vocab = model_info.vocab_size
    if prompt_token_ids and set(map(type, prompt_token_ids)) <= _INT_TYPE and (
            0 <= min(prompt_token_ids) and max(prompt_token_ids) < vocab):
        return list(prompt_token_ids)   # the common case, checked without a Python loop
    bad = [t for t in prompt_token_ids if not isinstance(t, int) or not 0 <= t < vocab]
    if bad:
        raise InvalidRequestError(f"prompt_token_ids must be ints in [0, {vocab}); "
                                  f"got {bad[0]!r}", field="prompt_token_ids")
    return list(prompt_token_ids)


def encode(prompt: str, tokenizer, eos_token_id: int | None) -> list[int]:
    ids = list(tokenizer.encode(prompt))
    # WordPiece tokenizers close a text with [SEP], which is also such a model's EOS; a
    # prompt that already ends in EOS asks the model to continue past the end.
    if len(ids) > 1 and ids[-1] == eos_token_id:
        ids.pop()
    return ids
