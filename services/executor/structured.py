"""Structured output: a grammar per request, applied to the logits as a token mask.

The grammar engine is xgrammar rather than llguidance: its ``GrammarCompiler`` keeps a cache
of compiled grammars keyed by the schema (so each schema is compiled once per process), its
bitmask kernels run on CPU and CUDA tensors alike (``apply_token_bitmask_inplace``, the mask
applied on the device where the logits are), and it is the default backend of vLLM and
SGLang, so the JSON-schema features and their limits are those users meet elsewhere.

A request's matcher lives in the executor beside its block table: it follows the tokens the
request samples, and is rebuilt from the request's output tokens when the executor's history
of it was reset (preemption, swap, a restarted executor). Requests without structured output
never touch this module: the sampler's plain path builds no mask.
"""
from __future__ import annotations

import json
import re
from functools import lru_cache

import torch

from lenserve_contract.errors import InvalidRequestError
from lenserve_contract.sampling_params import StructuredOutput

_LOG_PREFIX = re.compile(r"^\[[0-9:]+\]\s*\S+:\d+:\s*")   # "[08:44:39] file.cc:4944: "


def _xgr():
    import xgrammar   # imported on first use: requests without a grammar never load it
    return xgrammar


@lru_cache(maxsize=256)
def check_structured_output(kind: str, schema: str) -> None:
    """Raise InvalidRequestError naming what is wrong with a schema, without a tokenizer (the
    gateway and the engine call this before a request is queued)."""
    if kind != "json_schema":
        return
    try:
        parsed = json.loads(schema)
    except ValueError as exc:
        raise InvalidRequestError(f"response_format: the JSON schema is not JSON: {exc}",
                                  field="response_format") from None
    if not isinstance(parsed, dict):
        raise InvalidRequestError("response_format: the JSON schema must be an object",
                                  field="response_format")
    try:
        _xgr().Grammar.from_json_schema(schema, strict_mode=True)
    except Exception as exc:  # noqa: BLE001 - xgrammar raises RuntimeError/ValueError kinds
        why = _LOG_PREFIX.sub("", str(exc).strip())
        raise InvalidRequestError(f"response_format: the JSON schema cannot be compiled: {why}",
                                  field="response_format") from None


class GrammarCache:
    """Compiled grammars of one tokenizer, compiled on first use and cached by schema."""

    def __init__(self, tokenizer, vocab_size: int, stop_token_ids: list[int]):
        xgr = _xgr()
        if tokenizer is None or not hasattr(tokenizer, "get_vocab"):
            raise InvalidRequestError("structured output needs the model's tokenizer, and this "
                                      "executor has none", field="response_format")
        info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size,
                                                  stop_token_ids=stop_token_ids or None)
        self.compiler = xgr.GrammarCompiler(info)   # its own cache, keyed by the schema
        self.vocab_size = vocab_size

    def compile(self, so: StructuredOutput):
        """The compiled grammar (from the cache after the first time; thread-safe: the
        serving core compiles ahead on a worker thread while iterations run)."""
        check_structured_output(so.kind, so.schema)
        # Compact JSON (no free whitespace between tokens): a small or unsure model can
        # otherwise emit whitespace until max_tokens (vLLM's --disable-any-whitespace).
        schema = '{"type": "object"}' if so.kind == "json_object" else so.schema
        try:
            return self.compiler.compile_json_schema(schema, strict_mode=True,
                                                     any_whitespace=False)
        except Exception as exc:  # noqa: BLE001 - xgrammar raises RuntimeError/ValueError kinds
            why = _LOG_PREFIX.sub("", str(exc).strip())
            raise InvalidRequestError(f"response_format: the JSON schema cannot be compiled: "
                                      f"{why}", field="response_format") from None

    def matcher(self, so: StructuredOutput):
        return _xgr().GrammarMatcher(self.compile(so))

    def fill_mask(self, matchers: list, rows: list[int], num_rows: int) -> torch.Tensor:
        """A bitmask of ``num_rows`` rows (the batch's logits), matcher ``i`` filling row
        ``rows[i]`` (host tensor, int32, ``ceil(vocab / 32)`` words); xgrammar indexes the
        mask by the logits' row, so rows without a grammar are allocated too."""
        xgr = _xgr()
        mask = xgr.allocate_token_bitmask(num_rows, self.vocab_size)
        for row, m in zip(rows, matchers):
            m.fill_next_token_bitmask(mask, row)
        return mask


def apply_mask(logits: torch.Tensor, mask: torch.Tensor, rows: list[int]) -> None:
    """Set to -inf, in place, the logits of tokens each row's grammar forbids."""
    _xgr().apply_token_bitmask_inplace(logits, mask.to(logits.device, non_blocking=True),
                                       indices=rows)
