"""Incremental detokenization and stop strings, per request.

Decoding the whole output every step is quadratic, and decoding one token at a time breaks
multi-byte characters and the leading-space handling of SentencePiece/BPE tokenizers. As in
vLLM, each step decodes a short window twice (with and without the new tokens) and keeps the
difference, only once it no longer ends in a partial character.

Stop strings are matched on the text; the text is cut before the match (vLLM's default,
``include_stop_str_in_output=False``). While a request runs, the last ``len(longest stop)-1``
characters are held back, since they may turn out to be the start of a stop string.
"""
from __future__ import annotations

_PROMPT_CONTEXT = 5      # prompt tokens decoded with the first outputs, for correct spacing


class IncrementalDetokenizer:
    def __init__(self, tokenizer, prompt_token_ids: list[int], stop: list[str]):
        self.tokenizer = tokenizer
        self._ids = list(prompt_token_ids[-_PROMPT_CONTEXT:])
        self._prefix_offset = 0
        self._read_offset = len(self._ids)
        self.text = ""
        self.stop = list(stop)
        self._holdback = max((len(s) for s in stop), default=1) - 1
        self._sent = 0           # characters of text already handed out

    def add_tokens(self, token_ids: list[int]) -> str | None:
        """Extend the text; returns the stop string that matched, if one did (text is then
        truncated before it)."""
        before = len(self.text)
        for token in token_ids:
            self._ids.append(token)
            self._step()
        return self._find_stop(before) if self.stop else None

    def _step(self) -> None:
        decode, ids = self.tokenizer.decode, self._ids
        prefix = decode(ids[self._prefix_offset:self._read_offset], skip_special_tokens=True)
        full = decode(ids[self._prefix_offset:], skip_special_tokens=True)
        if len(full) > len(prefix) and not full.endswith("\ufffd"):
            self.text += full[len(prefix):]
            self._prefix_offset = self._read_offset
            self._read_offset = len(ids)

    def _find_stop(self, before: int) -> str | None:
        # Only a match overlapping the new text can be new; the earliest one wins.
        found = [(i, s) for s in self.stop
                 if (i := self.text.find(s, max(0, before - len(s) + 1))) >= 0]
        if not found:
            return None
        idx, stop = min(found)
        self.text = self.text[:idx]
        return stop

    def visible_text(self, finished: bool) -> str:
        if finished or not self._holdback:
            return self.text
        return self.text[: max(0, len(self.text) - self._holdback)]

    def take_delta(self, finished: bool) -> str:
        """Visible text not handed out before."""
        visible = self.visible_text(finished)
        delta = visible[self._sent:]
        self._sent = max(self._sent, len(visible))
        return delta
