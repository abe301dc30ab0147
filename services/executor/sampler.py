"""Token sampling over a batch of logits, on their device: greedy, temperature, top-k, top-p,
min-p, logit bias, penalties, grammar masks, per-request seeds, log-probabilities.

Greedy rows are one argmax over the batch. Random rows use the exponential race
(``argmax(p / E)`` with ``E ~ Exp(1)`` picks index ``i`` with probability ``p_i``), so the
randomness is one noise vector per row. A seeded request draws its noise from a generator
seeded by ``(seed, num_output_tokens)``: its tokens depend neither on which other requests share
the batch nor on whether it was preempted and recomputed. Unseeded rows draw from one
generator seeded from the operating system's entropy when the sampler is made, so two
processes (or two restarts of one server) never repeat each other's "random" text.

A batch whose requests ask for nothing beyond temperature, top-k and top-p takes the plain
path: no copy of the logits, no extra tensors. Everything else is added only for the rows
that ask, and all of a step's results come back to the host in one copy. The top logprobs are
one ``topk`` with the largest ``k`` asked, over the rows that ask; argmax and top-k go
through ``reductions`` (exact, and several times faster than PyTorch's own on a CPU).
"""
from __future__ import annotations

import secrets
from dataclasses import dataclass, field

import torch

from lenserve_contract.sampling_params import SamplingParams
from services.executor.logits_processors import (
    apply_logit_bias,
    apply_penalties,
    min_p_filter,
    top_k_filter,
    top_p_filter,
)
from services.executor.reductions import argmax_rows, topk_rows

__all__ = ["Penalties", "SampleRequest", "Sampler", "SamplerOutput", "step_seed",
           "top_k_filter", "top_p_filter"]

_MIX = 0x9E3779B97F4A7C15  # golden-ratio multiplier: spreads consecutive seeds apart


@dataclass
class SampleRequest:
    params: SamplingParams
    num_output_tokens: int = 0


@dataclass
class Penalties:
    """The seen tokens of the batch's penalized rows, on the device (see
    ``logits_processors.apply_penalties``)."""

    index: torch.Tensor     # [2, n] long: batch row, token
    values: torch.Tensor    # [4, n] float: output count, repetition, frequency, presence


@dataclass
class Mask:
    """Grammar bitmask rows (host int32, one per constrained row) and the rows they apply to."""

    rows: list[int]
    bitmask: torch.Tensor


@dataclass
class SamplerOutput:
    tokens: list[int]
    logprobs: list[float]
    top: dict[int, list[tuple[int, float]]] = field(default_factory=dict)   # row -> top-k


def step_seed(seed: int, num_output_tokens: int) -> int:
    return (seed * _MIX + num_output_tokens) % (2 ** 63)


class Sampler:
    def __init__(self, seed: int | None = None):
        """``seed`` fixes the unseeded rows' stream (tests); None takes fresh entropy."""
        self.seed = secrets.randbits(63) if seed is None else seed
        self._generators: dict[torch.device, torch.Generator] = {}

    def sample(self, logits: torch.Tensor, requests: list[SampleRequest],
               penalties: Penalties | None = None, mask: Mask | None = None) -> SamplerOutput:
        """One token per row of ``logits[n, vocab]``, with its log-probability under the
        model's raw distribution (before temperature, penalties and masks, as vLLM reports it),
        and for requests with ``logprobs=k`` the ``k`` most likely tokens. Bias, penalties and
        masks change ``logits`` in place."""
        logits = logits.float()
        params = [r.params for r in requests]
        logprobs = torch.log_softmax(logits, dim=-1)    # of the raw logits, before any change
        if penalties is not None or mask is not None or not all(p.plain for p in params):
            self._process(logits, params, penalties, mask)
        tokens = argmax_rows(logits)
        rows = [i for i, p in enumerate(params) if not p.greedy]
        if rows:
            tokens[rows] = self._sample_random(logits[rows], [requests[i] for i in rows])
        picked = logprobs.gather(1, tokens[:, None])[:, 0]
        return self._to_host(tokens, picked, logprobs, params)

    def _process(self, logits: torch.Tensor, params: list[SamplingParams],
                 penalties: Penalties | None, mask: Mask | None) -> None:
        if any(p.logit_bias for p in params):
            apply_logit_bias(logits, params)
        if penalties is not None:
            apply_penalties(logits, penalties.index, penalties.values)
        if mask is not None:
            from services.executor.structured import apply_mask
            apply_mask(logits, mask.bitmask, mask.rows)

    def _to_host(self, tokens: torch.Tensor, picked: torch.Tensor, logprobs: torch.Tensor,
                 params: list[SamplingParams]) -> SamplerOutput:
        """One device-to-host copy for everything (token ids are exact in float64)."""
        want = [i for i, p in enumerate(params) if p.logprobs is not None]
        k = max((params[i].logprobs for i in want), default=0)
        parts = [tokens.double(), picked.double()]
        if want and k:
            rows = logprobs if len(want) == len(params) else logprobs[want]   # no copy if all
            values, indices = topk_rows(rows, k)
            parts += [indices.double().flatten(), values.double().flatten()]
        flat = torch.cat(parts).cpu().tolist()
        n = len(params)
        out = SamplerOutput([int(t) for t in flat[:n]], flat[n:2 * n])
        ids, vals = flat[2 * n:2 * n + len(want) * k], flat[2 * n + len(want) * k:]
        for j, i in enumerate(want):
            kk = params[i].logprobs
            out.top[i] = [(int(ids[j * k + c]), vals[j * k + c]) for c in range(kk)]
        return out

    def _sample_random(self, logits: torch.Tensor, requests: list[SampleRequest]) -> torch.Tensor:
        temps = torch.tensor([r.params.temperature for r in requests], device=logits.device)
        probs = torch.softmax(logits / temps[:, None], dim=-1)
        probs = min_p_filter(probs, [r.params.min_p for r in requests])
        probs = top_p_filter(top_k_filter(probs, [r.params.top_k for r in requests]),
                             [r.params.top_p for r in requests])
        return argmax_rows(probs / self._noise(requests, probs.shape[1], probs.device))

    def _noise(self, requests: list[SampleRequest], vocab: int,
               device: torch.device) -> torch.Tensor:
        """Exp(1) noise per row: unseeded rows in one draw from the shared generator, each
        seeded row from its own ``(seed, step)`` generator."""
        unseeded = [i for i, r in enumerate(requests) if r.params.seed is None]
        if len(unseeded) == len(requests):
            noise = torch.empty(len(requests), vocab, device=device)
            return noise.exponential_(generator=self._shared_generator(device))
        noise = torch.empty(len(requests), vocab, device=device)
        if unseeded:
            draw = torch.empty(len(unseeded), vocab, device=device)
            draw.exponential_(generator=self._shared_generator(device))
            noise[unseeded] = draw
        for i, r in enumerate(requests):
            if r.params.seed is not None:
                gen = torch.Generator(device=device)
                gen.manual_seed(step_seed(r.params.seed, r.num_output_tokens))
                noise[i].exponential_(generator=gen)
        return noise

    def _shared_generator(self, device: torch.device) -> torch.Generator:
        if device not in self._generators:
            gen = torch.Generator(device=device)
            gen.manual_seed(self.seed)
            self._generators[device] = gen
        return self._generators[device]
