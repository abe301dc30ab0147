"""A minimal continuous-batching driver for executor tests.

Chunked prefill under a token budget, decode tokens first, admission only when a request's
whole KV footprint fits (so with a small pool later requests wait), one ``execute`` per
iteration. It records enough to prove the iterations really mixed prefill and decode.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from lenserve_contract.sampling_params import SamplingParams
from services.executor.kv_cache import BlockAllocator
from services.executor.types import ExecutorInput, ScheduledSequence


@dataclass
class _Request:
    rid: str
    prompt: list[int]
    computed: int = 0
    blocks: list[int] = field(default_factory=list)
    output: list[int] = field(default_factory=list)
    chunks: int = 0


@dataclass
class Stats:
    iterations: int = 0
    mixed_iterations: int = 0       # prefill chunk and decode token in the same iteration
    chunked_prompts: int = 0        # prompts prefilled over more than one iteration
    waited: int = 0                 # requests that found the pool full when first considered


def serve(executor, prompts: list[list[int]], *, max_tokens: int, token_budget: int = 64,
          eos_token_id: int | None = None, waves_per_iteration: int = 1,
          ) -> tuple[list[list[int]], Stats]:
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    block_size = executor.block_size
    alloc = BlockAllocator(executor.kv.num_blocks)
    waiting = deque(_Request(str(i), p) for i, p in enumerate(prompts))
    running: list[_Request] = []
    done: dict[str, list[int]] = {}
    stats, blocked = Stats(), set()
    while waiting or running:
        seqs, budget = [], token_budget
        for r in running:
            if r.computed >= len(r.prompt):
                seqs.append(ScheduledSequence(r.rid, [r.output[-1]], r.computed, r.blocks, True,
                                              params, len(r.output)))
                budget -= 1
        num_decode = len(seqs)
        while waiting:
            need = -(-(len(waiting[0].prompt) + max_tokens) // block_size)
            if alloc.num_free < need:
                blocked.add(waiting[0].rid)
                break
            r = waiting.popleft()
            r.blocks = alloc.allocate(need)
            running.append(r)
        for r in running:
            if r.computed < len(r.prompt) and budget > 0:
                n = min(len(r.prompt) - r.computed, budget)
                seqs.append(ScheduledSequence(r.rid, r.prompt[r.computed:r.computed + n],
                                              r.computed, r.blocks,
                                              r.computed + n == len(r.prompt), params, 0))
                budget -= n
                r.chunks += 1
        assert seqs, "no progress possible: a request needs more blocks than the pool has"
        stats.iterations += 1
        stats.mixed_iterations += int(0 < num_decode < len(seqs))
        waves = _waves(len(seqs), waves_per_iteration)
        out = executor.execute(ExecutorInput(stats.iterations, seqs, waves=waves))
        for s in seqs:
            r = next(x for x in running if x.rid == s.request_id)
            r.computed += s.num_tokens
            if s.sample:
                r.output.append(out.sampled[r.rid])
        for r in list(running):
            if len(r.output) == max_tokens or (r.output and r.output[-1] == eos_token_id):
                running.remove(r)
                alloc.free(r.blocks)
                done[r.rid] = r.output
                stats.chunked_prompts += int(r.chunks > 1)
        alloc.check_integrity()
    stats.waited = len(blocked)
    return [done[str(i)] for i in range(len(prompts))], stats


def _waves(num_seqs: int, count: int) -> list[list[int]] | None:
    if count <= 1:
        return None
    return [list(range(num_seqs))[i::count] for i in range(count)]
