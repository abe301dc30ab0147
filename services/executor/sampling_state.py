"""What the executor keeps per request for sampling that reads earlier tokens: penalties and
grammars. Requests with neither keep nothing here.

Like block tables, this state lives in the executor between iterations and is keyed by
request id: the scheduler names the requests to forget (``finished_request_ids``) and, with
a whole block table, sends the tokens already in the KV cache (``context_token_ids``), from
which the history is rebuilt (after a preemption, a swap, or a restarted executor).

Penalties read device tensors: each penalized request owns a row of a count slab
(``[rows, vocab]`` output token counts, and the prompt's tokens as a mask). A row is built
once from the host history when the request first samples; afterwards the sampled tokens
are added on the device, so a decode step moves nothing per request between host and
device. Grammars are xgrammar matchers advanced with each sampled token on the host.
"""
from __future__ import annotations

import torch

from services.executor.sampler import Mask, Penalties, SamplerOutput
from services.executor.types import ScheduledSequence


class _History:
    __slots__ = ("matcher", "slot", "tokens")

    def __init__(self, tokens: list[int]):
        self.tokens = tokens        # every token of the request in the KV cache, in order
        self.slot: int | None = None
        self.matcher = None


class SamplingState:
    def __init__(self, vocab_size: int, device: torch.device, grammars=None):
        """``grammars``: a callable returning the ``GrammarCache`` (made on first use)."""
        self.vocab_size, self.device = vocab_size, device
        self._grammars = grammars
        self._history: dict[str, _History] = {}
        self._free: list[int] = []
        self.counts = torch.zeros(0, vocab_size, dtype=torch.int32, device=device)
        self.prompt_mask = torch.zeros(0, vocab_size, dtype=torch.bool, device=device)

    def __len__(self) -> int:
        return len(self._history)

    def forget(self, request_ids: list[str]) -> None:
        for rid in request_ids:
            h = self._history.pop(rid, None)
            if h is not None and h.slot is not None:
                self._free.append(h.slot)

    def observe(self, seqs: list[ScheduledSequence]) -> None:
        """Record the tokens fed this iteration of requests that need their history."""
        for s in seqs:
            if not s.sampling_params.needs_history:
                continue
            h = self._history.get(s.request_id)
            if h is None or not s.block_table_is_delta:
                self.forget([s.request_id])
                self._history[s.request_id] = _History(list(s.context_token_ids) + s.token_ids)
            else:
                h.tokens.extend(s.token_ids)

    def prepare(self, seqs: list[ScheduledSequence]) -> tuple[Penalties | None, Mask | None]:
        """The penalty rows and grammar masks of the sampling sequences ``seqs`` (in batch
        order)."""
        pen_rows, slots, mask_rows, matchers = [], [], [], []
        for row, s in enumerate(seqs):
            params = s.sampling_params
            if not params.needs_history:
                continue
            h = self._history[s.request_id]
            if params.penalized:
                if h.slot is None:
                    h.slot = self._build_row(h.tokens, s.num_output_tokens)
                pen_rows.append(row)
                slots.append(h.slot)
            if params.structured_output is not None:
                if h.matcher is None:
                    h.matcher = self._build_matcher(s, h.tokens)
                if h.matcher.is_terminated():
                    continue    # the value is complete: what follows is up to EOS handling
                mask_rows.append(row)
                matchers.append(h.matcher)
        penalties = mask = None
        if pen_rows:
            idx = torch.tensor(slots, device=self.device)
            penalties = Penalties(pen_rows, self.counts[idx], self.prompt_mask[idx], idx)
        if mask_rows:
            mask = Mask(mask_rows, self._grammars().fill_mask(matchers))
        return penalties, mask

    def advance(self, seqs: list[ScheduledSequence], penalties: Penalties | None,
                out: SamplerOutput) -> None:
        """Count the sampled tokens (on the device) and advance the grammars (on the host)."""
        if penalties is not None:
            rows = torch.tensor(penalties.rows, device=self.device)
            sampled = out.token_tensor[rows]
            self.counts.index_put_((penalties.slots, sampled),
                                   torch.ones_like(sampled, dtype=torch.int32), accumulate=True)
        for row, s in enumerate(seqs):
            if s.sampling_params.structured_output is not None:
                matcher = self._history[s.request_id].matcher
                if not matcher.is_terminated():
                    matcher.accept_token(out.tokens[row])

    def _build_row(self, tokens: list[int], num_output_tokens: int) -> int:
        slot = self._free.pop() if self._free else self._grow()
        split = len(tokens) - num_output_tokens
        dev, vocab = self.device, self.vocab_size
        outputs = torch.tensor(tokens[split:], dtype=torch.long, device=dev)
        self.counts[slot] = torch.bincount(outputs, minlength=vocab).to(torch.int32)
        self.prompt_mask[slot] = False
        self.prompt_mask[slot, torch.tensor(tokens[:split], dtype=torch.long, device=dev)] = True
        return slot

    def _grow(self) -> int:
        """Double the slab (rows are few: one per running penalized request)."""
        old = self.counts.shape[0]
        new = max(8, 2 * old)
        self.counts = torch.cat([self.counts, self.counts.new_zeros(new - old, self.vocab_size)])
        self.prompt_mask = torch.cat([self.prompt_mask,
                                      self.prompt_mask.new_zeros(new - old, self.vocab_size)])
        self._free.extend(range(new - 1, old, -1))
        return old

    def _build_matcher(self, s: ScheduledSequence, tokens: list[int]):
        matcher = self._grammars().matcher(s.sampling_params.structured_output)
        for token in tokens[len(tokens) - s.num_output_tokens:]:
            matcher.accept_token(token)     # replay after a reset of the history
        return matcher
