"""Multi-turn chat from ShareGPT conversations: each human turn is a request that carries the
whole conversation so far (every earlier turn and reply) and asks for as many tokens as the
real reply had. A conversation's first turn arrives at its start time (Poisson over
conversations); each later turn follows the previous reply after a think time, so a
conversation's turns never overlap (``BenchRequest.after``, ``followups.Arrivals``).

Prompts are built from separately tokenized segments, ``User: <turn>\\nAssistant:`` and
`` <reply>\\n``, so turn k's prompt is exactly turn k-1's prompt followed by the previous reply
and the new turn: the prefix a prefix cache can serve. The engine's own reply to turn k-1 is
not what the next prompt carries (outputs are forced to the real reply's length, not its
text), so a cache serves the earlier prompt, not the generated reply, as it would a client
that edits the history it sends back.

``shared_prefix``: token ids put in front of every prompt of any workload (a system prompt).
"""
from __future__ import annotations

import dataclasses
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from lenserve.workloads.arrivals import synthetic_offsets
from lenserve.workloads.sampling import _encode
from lenserve.workloads.types import BenchRequest, Workload


@dataclass(frozen=True)
class MultiTurnConfig:
    num_requests: int
    seed: int = 0
    max_prompt_len: int = 1024
    max_total_len: int = 2048       # a conversation ends at its first turn past either limit
    think_time_s: float = 5.0       # mean of the exponential pause before the next turn
    min_len: int = 4
    fixed_output_len: int | None = None   # --output-len: every turn asks for this many tokens

    def __post_init__(self) -> None:
        if self.num_requests < 1:
            raise ValueError(f"--num-prompts must be >= 1, got {self.num_requests}")
        if self.think_time_s < 0:
            raise ValueError(f"think time must be >= 0, got {self.think_time_s}")


def conversations(records: Iterable[Any]) -> list[list[tuple[str, str]]]:
    """Each record's (human turn, reply) exchanges from its start, while turns alternate
    human, assistant (the first break ends the conversation)."""
    out = []
    for record in records:
        turns = (record.get("conversations") if isinstance(record, dict) else None) or []
        exchanges = []
        for i in range(0, len(turns) - 1, 2):
            turn, reply = turns[i], turns[i + 1]
            if turn.get("from") not in ("human", "user") or reply.get("from") in ("human", "user") \
                    or not turn.get("value") or not reply.get("value"):
                break
            exchanges.append((turn["value"], reply["value"]))
        if exchanges:
            out.append(exchanges)
    return out


def multiturn_requests(convs: Sequence[list[tuple[str, str]]], tokenizer: Any,
                       cfg: MultiTurnConfig, system_ids: Sequence[int] = ()
                       ) -> list[list[BenchRequest]]:
    """Requests, grouped by conversation, ``cfg.num_requests`` in all (arrivals not set:
    ``timed`` does that). Conversations are taken in a seeded order."""
    rng = random.Random(cfg.seed)
    order = list(range(len(convs)))
    rng.shuffle(order)
    start = tuple(_encode(tokenizer, "", special=True)) + tuple(system_ids)
    groups, total = [], 0
    for index in order:
        group = _turns(convs[index], tokenizer, cfg, start, f"c{index}", rng)
        group = group[:cfg.num_requests - total]
        if group:
            groups.append(group)
            total += len(group)
        if total == cfg.num_requests:
            return groups
    raise ValueError(f"the conversations give only {total} turns that fit the length limits "
                     f"(prompt <= {cfg.max_prompt_len}, total <= {cfg.max_total_len}); asked "
                     f"for {cfg.num_requests}")


def _turns(exchanges: list[tuple[str, str]], tokenizer: Any, cfg: MultiTurnConfig,
           start: tuple[int, ...], conv_id: str, rng: random.Random) -> list[BenchRequest]:
    history, turns, previous = start, [], None
    for k, (human, reply) in enumerate(exchanges):
        prompt = history + tuple(_encode(tokenizer, f"User: {human}\nAssistant:", False))
        reply_ids = tuple(_encode(tokenizer, f" {reply}\n", False))
        output_len = cfg.fixed_output_len or len(_encode(tokenizer, reply, False))
        if not (cfg.min_len <= len(prompt) <= cfg.max_prompt_len and output_len >= cfg.min_len
                and len(prompt) + output_len <= cfg.max_total_len):
            break
        rid = f"{conv_id}-t{k}"
        think = rng.expovariate(1 / cfg.think_time_s) if cfg.think_time_s > 0 else 0.0
        turns.append(BenchRequest(rid, prompt, output_len, after=previous,
                                  think_s=think if previous else 0.0))
        history, previous = prompt + reply_ids, rid
    return turns


def timed(name: str, groups: list[list[BenchRequest]], rate: float, burstiness: float = 1.0,
          seed: int = 0) -> Workload:
    """Conversations start at ``rate`` per second (gamma arrivals, Poisson by default); each
    later turn is due after the previous reply (its offset is the conversation's start)."""
    starts = synthetic_offsets(len(groups), rate, burstiness, seed)
    timed_requests = [dataclasses.replace(r, arrival_offset=t)
                      for group, t in zip(groups, starts) for r in group]
    return Workload(name, tuple(sorted(timed_requests, key=lambda r: r.arrival_offset)))


def shared_prefix(requests: Iterable[BenchRequest], prefix: Sequence[int]) -> list[BenchRequest]:
    """Every request with ``prefix`` (a system prompt's token ids) in front of its prompt."""
    head = tuple(prefix)
    return [dataclasses.replace(r, prompt_token_ids=head + r.prompt_token_ids, prompt=None)
            for r in requests]


def system_prompt_ids(tokenizer: Any, length: int, seed: int = 0) -> tuple[int, ...]:
    """``length`` token ids of a fixed pseudo-random system prompt, in the tokenizer's
    ordinary (non-special) vocabulary."""
    from lenserve.workloads.sampling import _Synthesiser
    return _Synthesiser(tokenizer, None, seed).ids(_SYSTEM_STREAM, length) if length else ()


_SYSTEM_STREAM = 1 << 40      # a random stream no dataset row index uses


def ideal_hit_tokens(prompts: Iterable[Sequence[int]], block: int) -> tuple[int, int]:
    """(prompt tokens, tokens an unbounded cache of ``block``-token blocks would serve): each
    prompt's leading full blocks whose whole prefix an earlier prompt had, never the last
    token (it is always computed)."""
    ids: dict[tuple, int] = {}
    total = hits = 0
    for tokens in prompts:
        total += len(tokens)
        parent, served = 0, True
        for i in range((len(tokens) - 1) // block):
            key = (parent, tuple(tokens[i * block:(i + 1) * block]))
            known = ids.get(key)
            if known is None:
                known = ids[key] = len(ids) + 1
                served = False
            elif served:
                hits += block
            parent = known
    return total, hits


__all__ = ["MultiTurnConfig", "conversations", "ideal_hit_tokens", "multiturn_requests",
           "shared_prefix", "system_prompt_ids", "timed"]
