"""What an iteration costs is modelled from a few counts of its batch, the same counts the
profiler measures and the cost models read."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

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


def from_scheduled(scheduled: Sequence[tuple[Any, int]]) -> tuple[IterationFeatures, list[str]]:
    """Features of a batch read from the scheduler's plan, ``(request, tokens fed)`` pairs,
    and the ids of the requests it samples: what ``from_input`` counts in the
    ``ExecutorInput`` built from that plan."""
    tokens = context = pairs = 0
    sampled_ids = []
    sample = sampled_ids.append
    for req, q in scheduled:
        done = req.num_computed_tokens
        end = done + q
        if end == len(req.token_ids):
            sample(req.request_id)
        tokens += q
        context += end
        pairs += q * (done + end + 1)       # twice attended_pairs(q, done), in integers
    # Exact: every partial sum is an integer below 2**53, so this is the float from_input adds
    # up sequence by sequence.
    attended = pairs / 2
    return (IterationFeatures(tokens, len(sampled_ids), attended, len(scheduled), context),
            sampled_ids)
