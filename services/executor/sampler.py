"""Token sampling: greedy, temperature, top-k, top-p, per-request seeds.

Greedy rows are one argmax over the batch. Random rows use the exponential race
(``argmax(p / E)`` with ``E ~ Exp(1)`` picks index ``i`` with probability ``p_i``), so the
randomness is one noise vector per row. A seeded request draws its noise from a generator
seeded by ``(seed, num_output_tokens)``: its tokens depend neither on which other requests share
the batch nor on whether it was preempted and recomputed.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from lenserve_contract.sampling_params import SamplingParams

_MIX = 0x9E3779B97F4A7C15  # golden-ratio multiplier: spreads consecutive seeds apart


@dataclass
class SampleRequest:
    params: SamplingParams
    num_output_tokens: int = 0


def step_seed(seed: int, num_output_tokens: int) -> int:
    return (seed * _MIX + num_output_tokens) % (2 ** 63)


class Sampler:
    def __init__(self, seed: int = 0):
        self.seed = seed
        self._generators: dict[torch.device, torch.Generator] = {}

    def sample(self, logits: torch.Tensor,
               requests: list[SampleRequest]) -> tuple[list[int], list[float]]:
        """One token per row of ``logits[n, vocab]``, with its log-probability under the
        model's raw distribution (before temperature and truncation, as vLLM reports it)."""
        logits = logits.float()
        tokens = logits.argmax(dim=-1)
        rows = [i for i, r in enumerate(requests) if not r.params.greedy]
        if rows:
            tokens[rows] = self._sample_random(logits[rows], [requests[i] for i in rows])
        logprobs = torch.log_softmax(logits, dim=-1).gather(1, tokens[:, None])[:, 0]
        # One device-to-host copy for both (token ids are exact in float64).
        both = torch.stack([tokens.double(), logprobs.double()]).cpu().tolist()
        return [int(t) for t in both[0]], both[1]

    def _sample_random(self, logits: torch.Tensor, requests: list[SampleRequest]) -> torch.Tensor:
        temps = torch.tensor([r.params.temperature for r in requests], device=logits.device)
        probs = torch.softmax(logits / temps[:, None], dim=-1)
        probs = top_p_filter(top_k_filter(probs, [r.params.top_k for r in requests]),
                             [r.params.top_p for r in requests])
        noise = torch.stack([self._noise(r, probs.shape[1], probs.device) for r in requests])
        return (probs / noise).argmax(dim=-1)

    def _noise(self, req: SampleRequest, vocab: int, device: torch.device) -> torch.Tensor:
        if req.params.seed is None:
            gen = self._shared_generator(device)
        else:
            gen = torch.Generator(device=device)
            gen.manual_seed(step_seed(req.params.seed, req.num_output_tokens))
        return torch.empty(vocab, device=device).exponential_(generator=gen)

    def _shared_generator(self, device: torch.device) -> torch.Generator:
        if device not in self._generators:
            gen = torch.Generator(device=device)
            gen.manual_seed(self.seed)
            self._generators[device] = gen
        return self._generators[device]


def top_k_filter(probs: torch.Tensor, top_k: list[int]) -> torch.Tensor:
    """Zero all but the ``k`` largest probabilities of each row; ``k <= 0`` keeps the row."""
    vocab = probs.shape[1]
    wanted = [k if 0 < k < vocab else vocab for k in top_k]
    if all(k == vocab for k in wanted):   # decided on the host: no device sync
        return probs
    ks = torch.tensor(wanted, device=probs.device)
    sorted_probs = probs.sort(dim=-1, descending=True).values
    kth = sorted_probs.gather(1, (ks - 1)[:, None])
    return probs.masked_fill(probs < kth, 0.0)


def top_p_filter(probs: torch.Tensor, top_p: list[float]) -> torch.Tensor:
    """Keep each row's smallest most-likely set whose mass reaches ``p`` (at least one token)."""
    if all(p >= 1.0 for p in top_p):
        return probs
    ps = torch.tensor(top_p, device=probs.device, dtype=probs.dtype)
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
    total = sorted_probs.sum(dim=-1, keepdim=True)
    drop_sorted = mass_before >= ps[:, None] * total
    drop = torch.zeros_like(drop_sorted).scatter(1, order, drop_sorted)
    return probs.masked_fill(drop, 0.0)
