"""FluidInfer's greedy packing of attention work into waves (report §4.2).

A wave is the attention of a set of sequences whose KV is on the device at once, so a wave's
blocks are bounded by the device KV the policy gives it. Inside a wave sequences run side by
side ("threads"); the wave lasts as long as its longest item. Packing greedily:

* the longest remaining item opens the wave and sets its span;
* the next longest item that fits the wave's KV opens another thread; the gap between its
  cost and the span is a bubble (type A: a shorter prefill; type B: a decode beside a
  prefill), filled with the longest remaining items that fit in it, found by binary search;
* when no remaining item fits the KV left, the wave closes and the next one opens.

Costs estimate attention work: queries x keys, n x (start + n) for a chunk of n new tokens
after ``start`` cached ones (a decode is 1 x context).
"""
from __future__ import annotations

import bisect


def attention_cost(num_computed_tokens: int, num_new_tokens: int) -> int:
    return num_new_tokens * (num_computed_tokens + num_new_tokens)


def pack_waves(costs: list[int], blocks: list[int], kv_limit: int) -> list[list[int]]:
    """Indices of the items, grouped into waves in execution order. Every item appears once;
    an item larger than ``kv_limit`` runs in a wave of its own."""
    remaining = sorted((c, i) for i, c in enumerate(costs))
    waves = []
    while remaining:
        waves.append(_one_wave(remaining, blocks, kv_limit))
    return waves


def _one_wave(remaining: list[tuple[int, int]], blocks: list[int], kv_limit: int) -> list[int]:
    wave: list[int] = []
    kv_left, span = kv_limit, None
    while remaining:
        head = _take(remaining, None, blocks, kv_left)
        if head is None:
            if wave:
                break
            head = remaining.pop()          # too big for any wave: alone
        wave.append(head[1])
        kv_left -= blocks[head[1]]
        span = head[0] if span is None else span
        kv_left = _fill(remaining, span - head[0], blocks, kv_left, wave)
    return wave


def _fill(remaining, bubble: int, blocks: list[int], kv_left: int, wave: list[int]) -> int:
    while bubble > 0 and remaining:
        item = _take(remaining, bubble, blocks, kv_left)
        if item is None:
            break
        wave.append(item[1])
        kv_left -= blocks[item[1]]
        bubble -= item[0]
    return kv_left


def _take(remaining, max_cost: int | None, blocks: list[int], kv_left: int):
    """Remove and return the costliest item with cost <= ``max_cost`` whose blocks fit."""
    end = len(remaining)
    if max_cost is not None:
        end = bisect.bisect_right(remaining, (max_cost, 1 << 62))
    for j in range(end - 1, -1, -1):
        if blocks[remaining[j][1]] <= kv_left:
            return remaining.pop(j)
    return None
