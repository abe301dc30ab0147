"""Log-probabilities in OpenAI's two response shapes.

Completions: ``{"tokens", "token_logprobs", "top_logprobs": [{token: logprob}], "text_offset"}``.
Chat: ``{"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob",
"bytes"}]}]}``. A token's text is the tokenizer's decoding of it alone; without a tokenizer it
is ``token_id:N`` (vLLM's ``return_tokens_as_token_ids`` form)."""
from __future__ import annotations

from lenserve_contract.outputs import Logprob


class TokenNames:
    """Token id -> text, remembered (the same tokens come back in many answers)."""

    def __init__(self, tokenizer=None):
        self.tokenizer = tokenizer if hasattr(tokenizer, "convert_ids_to_tokens") else None
        self._cache: dict[int, str] = {}

    def __call__(self, token_id: int) -> str:
        text = self._cache.get(token_id)
        if text is None:
            if self.tokenizer is None:
                text = f"token_id:{token_id}"
            else:
                text = self.tokenizer.decode([token_id])
            if len(self._cache) < 1 << 17:
                self._cache[token_id] = text
        return text


def completion_logprobs(entries: list[Logprob], names: TokenNames, offset: int = 0) -> dict:
    """``offset``: characters of text before these tokens (a stream's earlier chunks)."""
    tokens = [names(e.token_id) for e in entries]
    offsets = []
    for t in tokens:
        offsets.append(offset)
        offset += len(t)
    return {"tokens": tokens, "token_logprobs": [e.logprob for e in entries],
            "top_logprobs": [{names(t): lp for t, lp in e.top} for e in entries],
            "text_offset": offsets}


def chat_logprobs(entries: list[Logprob], names: TokenNames) -> dict:
    return {"content": [{**_chat_entry(names(e.token_id), e.logprob),
                         "top_logprobs": [_chat_entry(names(t), lp) for t, lp in e.top]}
                        for e in entries]}


def _chat_entry(token: str, logprob: float) -> dict:
    return {"token": token, "logprob": logprob, "bytes": list(token.encode("utf-8"))}
