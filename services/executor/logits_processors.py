"""What the sampler does to a batch of logits before it draws, each for the rows that ask.

All of it runs on the logits' device over the whole batch at once: per-request values travel
as one small tensor per kind (built on the host from the requests' parameters, copied without
a sync), never as one kernel or one transfer per request. Semantics follow vLLM: the logit
bias is added first, then the repetition penalty (prompt and output tokens: a positive logit
is divided by it, a negative one multiplied), then the frequency penalty (times each output
token's count) and the presence penalty (once per token that occurred in the output). The
logits are changed in place: the sampler's caller hands over a fresh batch each step."""
from __future__ import annotations

import torch

from lenserve_contract.sampling_params import SamplingParams
from services.executor.reductions import topk_rows


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


def apply_penalties(logits: torch.Tensor, index: torch.Tensor, values: torch.Tensor) -> None:
    """Penalize, in place, the tokens each row has seen. ``index[2, n]``: (batch row, token)
    of every distinct token of a penalized row's prompt and output; ``values[4, n]``: that
    token's output count, and the row's repetition, frequency and presence penalties. Sparse:
    the cost follows the tokens seen, not the vocabulary."""
    rows, tokens = index[0], index[1]
    count, rep, freq, pres = values
    seen = logits[rows, tokens]
    seen = torch.where(seen > 0, seen / rep, seen * rep)
    seen = seen - freq * count - pres * (count > 0).to(seen.dtype)
    logits.index_put_((rows, tokens), seen)


def min_p_filter(probs: torch.Tensor, min_p: list[float]) -> torch.Tensor:
    """Zero the tokens less likely than ``min_p`` times the row's most likely one."""
    if not any(min_p):
        return probs
    ps = torch.tensor(min_p, device=probs.device, dtype=probs.dtype)[:, None]
    floor = probs.amax(dim=-1, keepdim=True) * ps
    return probs.masked_fill(probs < floor, 0.0)


def top_k_filter(probs: torch.Tensor, top_k: list[int]) -> torch.Tensor:
    """Zero all but the ``k`` largest probabilities of each row; ``k <= 0`` keeps the row.
    One ``topk`` with the largest ``k`` asked gives each row's k-th value (no sort)."""
    vocab = probs.shape[1]
    limited = [0 < k < vocab for k in top_k]
    if not any(limited):   # decided on the host: no device sync
        return probs
    widest = max(k for k, lim in zip(top_k, limited) if lim)
    ks = torch.tensor([k - 1 if lim else 0 for k, lim in zip(top_k, limited)],
                      device=probs.device)
    kth = topk_rows(probs, widest)[0].gather(1, ks[:, None])
    if not all(limited):    # a row without top-k keeps every token
        keep = torch.tensor([not lim for lim in limited], device=probs.device)
        kth = kth.masked_fill(keep[:, None], 0.0)
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
