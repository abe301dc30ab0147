"""What an iteration costs is modelled from a few counts of its batch, the same counts the
profiler measures and the cost models read."""
from __future__ import annotations

from typing import NamedTuple

from services.executor.types import ExecutorInput

FEATURES = ("tokens", "sampled", "attended", "context")


class IterationFeatures(NamedTuple):
    tokens: int        # tokens fed (prefill chunks + one per decode): the dense layers' rows
    sampled: int       # sequences sampled: LM head rows and sampler work
    attended: float    # (query, key) pairs in attention, summed over sequences (causal)
    num_seqs: int      # sequences in the batch
    context: int = 0   # KV tokens the batch reads once it has run (decode attention, bytes)


def attended_pairs(num_tokens: int, num_computed: int) -> float:
    """Causal (query, key) pairs of a chunk of ``num_tokens`` after ``num_computed`` in KV."""
    return num_tokens * num_computed + num_tokens * (num_tokens + 1) / 2


def from_groups(groups: list[tuple[int, int, int]]) -> IterationFeatures:
    """Features of a batch described as ``(count, tokens each, computed each)`` groups."""
    tokens = sampled = seqs = context = 0
    attended = 0.0
    for count, q, computed in groups:
        tokens += count * q
        sampled += count
        seqs += count
        context += count * (computed + q)
        attended += count * attended_pairs(q, computed)
    return IterationFeatures(tokens, sampled, attended, seqs, context)


def from_input(batch: ExecutorInput) -> IterationFeatures:
    tokens = sampled = context = 0
    attended = 0.0
    for seq in batch.sequences:
        q, done = len(seq.token_ids), seq.num_computed_tokens
        tokens += q
        sampled += seq.sample
        context += done + q
        attended += q * done + q * (q + 1) / 2
    return IterationFeatures(tokens, sampled, attended, len(batch.sequences), context)
