"""What the executor keeps per request for sampling that reads earlier tokens: penalties and
grammars. Requests with neither keep nothing here.

Like block tables, this state lives in the executor between iterations and is keyed by
request id: the scheduler names the requests to forget (``finished_request_ids``) and, with
a whole block table, sends the tokens already in the KV cache (``context_token_ids``), from
which the history is rebuilt (after a preemption, a swap, or a restarted executor).

Penalties are sparse: a request's distinct prompt and output tokens with their output counts,
kept on the host in growable numpy arrays (the sampled tokens come back to the host each step
anyway). Each step the penalized rows' entries go to the device in two copies for the whole
batch, and the sampler touches only those logits: the cost follows the tokens seen, not the
vocabulary. Grammars are xgrammar matchers advanced with each sampled token on the host.
"""
from __future__ import annotations

import numpy as np
import torch

from services.executor.sampler import Mask, Penalties, SamplerOutput
from services.executor.types import ScheduledSequence


class SeenTokens:
    """A request's distinct tokens: output count of each, prompt tokens at count 0."""

    def __init__(self, prompt: list[int], outputs: list[int]):
        self.pos: dict[int, int] = {}
        self.tokens = np.zeros(max(16, 2 * (len(prompt) + len(outputs))), np.int64)
        self.counts = np.zeros(len(self.tokens), np.float32)
        self.n = 0
        for t in prompt:
            if t not in self.pos:
                self._append(t)
        for t in outputs:
            self.add(t)

    def _append(self, token: int) -> int:
        if self.n == len(self.tokens):
            self.tokens = np.concatenate([self.tokens, np.zeros_like(self.tokens)])
            self.counts = np.concatenate([self.counts, np.zeros_like(self.counts)])
        self.pos[token] = i = self.n
        self.tokens[i] = token
        self.n += 1
        return i

    def add(self, token: int) -> None:
        i = self.pos.get(token)
        if i is None:
            i = self._append(token)     # first: it may replace the arrays
        self.counts[i] += 1


class _History:
    __slots__ = ("matcher", "seen", "tokens")

    def __init__(self, tokens: list[int]):
        self.tokens = tokens        # every token of the request in the KV cache, in order
        self.seen: SeenTokens | None = None
        self.matcher = None


class SamplingState:
    def __init__(self, device: torch.device, grammars=None):
        """``grammars``: a callable returning the ``GrammarCache`` (made on first use)."""
        self.device = device
        self._grammars = grammars
        self._history: dict[str, _History] = {}

    def __len__(self) -> int:
        return len(self._history)

    def forget(self, request_ids: list[str]) -> None:
        for rid in request_ids:
            self._history.pop(rid, None)

    def observe(self, seqs: list[ScheduledSequence]) -> None:
        """Record the tokens fed this iteration of requests that need their history."""
        for s in seqs:
            if not s.sampling_params.needs_history:
                continue
            h = self._history.get(s.request_id)
            if h is None or not s.block_table_is_delta:
                self._history[s.request_id] = _History(list(s.context_token_ids) + s.token_ids)
            else:
                h.tokens.extend(s.token_ids)

    def prepare(self, seqs: list[ScheduledSequence]) -> tuple[Penalties | None, Mask | None]:
        """The penalties and grammar masks of the sampling sequences ``seqs`` (batch order)."""
        pen_rows, seen, mask_rows, matchers = [], [], [], []
        for row, s in enumerate(seqs):
            params = s.sampling_params
            if not params.needs_history:
                continue
            h = self._history[s.request_id]
            split = len(h.tokens) - s.num_output_tokens
            if params.penalized:
                if h.seen is None:
                    h.seen = SeenTokens(h.tokens[:split], h.tokens[split:])
                pen_rows.append(row)
                seen.append(h.seen)
            if params.structured_output is not None:
                if h.matcher is None:
                    h.matcher = self._build_matcher(s, h.tokens[split:])
                if h.matcher.is_terminated():
                    continue    # the value is complete: what follows is up to EOS handling
                mask_rows.append(row)
                matchers.append(h.matcher)
        penalties = self._penalties(seqs, pen_rows, seen) if pen_rows else None
        mask = (Mask(mask_rows, self._grammars().fill_mask(matchers, mask_rows, len(seqs)))
                if mask_rows else None)
        return penalties, mask

    def _penalties(self, seqs, rows: list[int], seen: list[SeenTokens]) -> Penalties:
        sizes = [s.n for s in seen]
        params = [seqs[r].sampling_params for r in rows]
        index = np.stack([np.repeat(np.asarray(rows, np.int64), sizes),
                          np.concatenate([s.tokens[:s.n] for s in seen])])
        per_row = np.array([[p.repetition_penalty, p.frequency_penalty, p.presence_penalty]
                            for p in params], np.float32)
        values = np.concatenate([np.concatenate([s.counts[:s.n] for s in seen])[None],
                                 np.repeat(per_row, sizes, axis=0).T])
        dev = self.device
        return Penalties(torch.from_numpy(index).to(dev, non_blocking=True),
                         torch.from_numpy(values).to(dev, non_blocking=True))

    def advance(self, seqs: list[ScheduledSequence], out: SamplerOutput) -> None:
        """Count the sampled tokens and advance the grammars (both on the host)."""
        for row, s in enumerate(seqs):
            params = s.sampling_params
            if not params.needs_history:
                continue
            h = self._history[s.request_id]
            token = out.tokens[row]
            if h.seen is not None:
                h.seen.add(token)
            if h.matcher is not None and not h.matcher.is_terminated():
                h.matcher.accept_token(token)

    def _build_matcher(self, s: ScheduledSequence, outputs: list[int]):
        matcher = self._grammars().matcher(s.sampling_params.structured_output)
        for token in outputs:
            matcher.accept_token(token)     # replay after a reset of the history
        return matcher
