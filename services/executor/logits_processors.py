"""What the sampler does to a batch of logits before it draws, each for the rows that ask.

All of it runs on the logits' device over the whole batch at once: per-request values travel
as one small tensor per kind (built on the host from the requests' parameters, copied without
a sync), never as one kernel or one transfer per request. Semantics follow vLLM: the logit
bias is added first, then the repetition penalty (prompt and output tokens: a positive logit
is divided by it, a negative one multiplied), then the frequency penalty (times each output
token's count) and the presence penalty (once per token that occurred in the output)."""
from __future__ import annotations

import torch

from lenserve_contract.sampling_params import SamplingParams


def apply_logit_bias(logits: torch.Tensor, params: list[SamplingParams]) -> None:
    rows, cols, vals = [], [], []
    for i, p in enumerate(params):
        for token, bias in p.logit_bias.items():
            rows.append(i)
            cols.append(token)
            vals.append(bias)
    if rows:
        dev = logits.device
        logits.index_put_((torch.tensor(rows, device=dev), torch.tensor(cols, device=dev)),
                          torch.tensor(vals, device=dev, dtype=logits.dtype), accumulate=True)


def apply_penalties(logits: torch.Tensor, counts: torch.Tensor, prompt_mask: torch.Tensor,
                    params: list[SamplingParams]) -> torch.Tensor:
    """``logits[m, V]`` of the penalized rows, their output token ``counts[m, V]`` and
    ``prompt_mask[m, V]`` (token occurs in the prompt); returns the penalized logits."""
    dev, dt = logits.device, logits.dtype
    rep = torch.tensor([p.repetition_penalty for p in params], device=dev, dtype=dt)[:, None]
    freq = torch.tensor([p.frequency_penalty for p in params], device=dev, dtype=dt)[:, None]
    pres = torch.tensor([p.presence_penalty for p in params], device=dev, dtype=dt)[:, None]
    in_output = counts > 0
    seen = in_output | prompt_mask
    penalized = torch.where(logits > 0, logits / rep, logits * rep)
    logits = torch.where(seen, penalized, logits)
    return logits - freq * counts.to(dt) - pres * in_output.to(dt)


def min_p_filter(probs: torch.Tensor, min_p: list[float]) -> torch.Tensor:
    """Zero the tokens less likely than ``min_p`` times the row's most likely one."""
    if not any(min_p):
        return probs
    ps = torch.tensor(min_p, device=probs.device, dtype=probs.dtype)[:, None]
    floor = probs.max(dim=-1, keepdim=True).values * ps
    return probs.masked_fill(probs < floor, 0.0)


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
