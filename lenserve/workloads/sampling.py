"""Deterministic choice of N requests from a dataset, and their arrival times.

Lengths are counted in the served model's tokenizer, as the papers and ``vllm bench serve``
do: the prompt as the engine will see it (with special tokens) and the reference reply as
generated tokens (without). Each request is then forced to that many output tokens with
``ignore_eos``, so every backend does the same work.
"""
from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from lenserve.workloads.arrivals import synthetic_offsets, trace_offsets
from lenserve.workloads.token_cache import TokenCache
from lenserve.workloads.types import TRACE_BLOCK_TOKENS, BenchRequest, Sample, Workload

_BATCH = 256      # texts per tokenizer call


@dataclass(frozen=True)
class SampleConfig:
    num_prompts: int
    seed: int = 0
    # vLLM's ShareGPT filter: drop requests shorter than 4 tokens either side, prompts over
    # 1024 tokens and prompt+output over 2048 (OPT's context).
    min_len: int = 4
    max_prompt_len: int = 1024
    max_total_len: int = 2048
    fixed_output_len: int | None = None
    # A contiguous window keeps a trace's bursts and gaps; shuffling would thin them out.
    contiguous: bool = False
    # More requests than the dataset holds: cycle through the ones that fit, in their order
    # (large simulated runs).
    repeat: bool = False
    # Tokens each of a trace's hash blocks (Mooncake: 512) becomes; fewer scale every prompt
    # down by the same factor, keeping the trace's prefix structure.
    trace_block_tokens: int = TRACE_BLOCK_TOKENS

    def __post_init__(self) -> None:
        if self.num_prompts < 1:
            raise ValueError(f"--num-prompts must be >= 1, got {self.num_prompts}")
        if self.fixed_output_len is not None and self.fixed_output_len < 1:
            raise ValueError(f"output length must be >= 1, got {self.fixed_output_len}")
        if not 1 <= self.trace_block_tokens <= TRACE_BLOCK_TOKENS:
            raise ValueError(f"--trace-block-tokens must be in 1..{TRACE_BLOCK_TOKENS}, got "
                             f"{self.trace_block_tokens}")


@dataclass(frozen=True)
class ArrivalConfig:
    request_rate: float = math.inf
    burstiness: float = 1.0
    seed: int = 0
    use_trace_timestamps: bool = False
    trace_time_scale: float = 1.0


class _Synthesiser:
    """Random non-special token ids, for traces that give only a prompt length."""

    def __init__(self, tokenizer: Any, vocab_size: int | None, seed: int):
        size = vocab_size or _vocab_size(tokenizer)
        if not size:
            raise ValueError("a tokenizer or a vocabulary size is needed to synthesise prompts")
        special = getattr(tokenizer, "all_special_ids", None) or []
        self.pool = np.setdiff1d(np.arange(size), np.asarray(special, dtype=np.int64))
        self.seed = seed

    def ids(self, index: int, length: int) -> tuple[int, ...]:
        rng = np.random.default_rng([self.seed, index])
        return tuple(int(t) for t in rng.choice(self.pool, size=length))

    def from_hashes(self, hash_ids: Sequence[int], length: int, block: int) -> tuple[int, ...]:
        """``length`` ids made of one fixed random block per hash id: equal ids, equal tokens,
        so prompts share exactly the prefixes the trace says they share."""
        blocks = self.__dict__.setdefault("_blocks", {})
        out: list[int] = []
        for h in hash_ids:
            ids = blocks.get(h)
            if ids is None:
                rng = np.random.default_rng([self.seed, _HASH_STREAM, h])
                ids = blocks[h] = tuple(rng.choice(self.pool, size=block).tolist())
            out.extend(ids)
            if len(out) >= length:
                break
        return tuple(out[:length])


_HASH_STREAM = 1 << 41       # random streams of hash blocks, apart from per-row ones


def _vocab_size(tokenizer: Any) -> int | None:
    if tokenizer is None:
        return None
    # len() counts added tokens that vocab_size leaves out; minimal tokenizers have only the latter.
    return len(tokenizer) if hasattr(tokenizer, "__len__") else getattr(tokenizer, "vocab_size", None)


def _encode(tokenizer: Any, text: str, special: bool) -> list[int]:
    if hasattr(tokenizer, "model_max_length"):
        # Hugging Face tokenizers warn about texts longer than the model; here that is the
        # point of counting (the length filter drops them).
        return list(tokenizer.encode(text, add_special_tokens=special, verbose=False))
    try:
        return list(tokenizer.encode(text, add_special_tokens=special))
    except TypeError:  # a tokenizer without special tokens takes no such flag
        return list(tokenizer.encode(text))


def _encode_batch(tokenizer: Any, texts: list[str], special: bool) -> list[list[int]]:
    """``_encode`` of each text; a Hugging Face tokenizer takes them in one call (the same ids,
    without the per-call overhead that dominated building large workloads)."""
    if texts and hasattr(tokenizer, "model_max_length") and callable(tokenizer):
        out = tokenizer(texts, add_special_tokens=special, verbose=False,
                        return_attention_mask=False, return_token_type_ids=False)
        return [list(ids) for ids in out["input_ids"]]
    return [_encode(tokenizer, text, special) for text in texts]


def _prompt_ids(tokenizer: Any, texts: list[str], cache: TokenCache | None
                ) -> list[tuple[int, ...]]:
    """The ids of each prompt (with special tokens); ``cache`` answers those it has seen."""
    if cache is None:
        return [tuple(p) for p in _encode_batch(tokenizer, texts, special=True)]
    return _through_cache(tokenizer, texts, True, cache.get_prompt, cache.put_prompt, tuple)


def _reply_lens(tokenizer: Any, texts: list[str], cache: TokenCache | None) -> list[int]:
    """The length of each reply in generated tokens (no special tokens)."""
    if cache is None:
        return [len(r) for r in _encode_batch(tokenizer, texts, special=False)]
    return _through_cache(tokenizer, texts, False, cache.get_reply, cache.put_reply, len)


def _through_cache(tokenizer: Any, texts: list[str], special: bool, get, put, value) -> list:
    """``value(ids)`` of each text: from ``get`` where the cache has it, else tokenized in
    one batch and stored with ``put``."""
    out = [get(t) for t in texts]
    missing = [i for i, v in enumerate(out) if v is None]
    counted = _encode_batch(tokenizer, [texts[i] for i in missing], special) if missing else []
    for i, ids in zip(missing, counted):
        out[i] = value(ids)
        put(texts[i], out[i])
    return out


def _lengths(batch: Sequence[Sample], tokenizer: Any, cfg: SampleConfig,
             cache: TokenCache | None = None) -> list[tuple[tuple[int, ...] | None, int]]:
    """Prompt ids (None for length traces, synthesised later) and the output length of each
    sample. A reference is counted only when its prompt could fit (else it is never used)."""
    texts = [i for i, sample in enumerate(batch) if sample.prompt is not None]
    if texts and tokenizer is None:
        raise ValueError("a tokenizer is needed to count the tokens of a text dataset")
    prompts = _prompt_ids(tokenizer, [batch[i].prompt for i in texts], cache)
    ids: dict[int, tuple[int, ...]] = dict(zip(texts, prompts))
    counted = [] if cfg.fixed_output_len else [i for i in texts if _prompt_fits(len(ids[i]), cfg)]
    replies = _reply_lens(tokenizer, [batch[i].reference or "" for i in counted], cache)
    reply_len = dict(zip(counted, replies))
    out: list[tuple[tuple[int, ...] | None, int]] = []
    for i, sample in enumerate(batch):
        if sample.prompt is None:
            out.append((None, cfg.fixed_output_len or sample.output_len or 0))
        else:
            out.append((ids[i], cfg.fixed_output_len or reply_len.get(i, 0)))
    return out


def _prompt_fits(prompt_len: int, cfg: SampleConfig) -> bool:
    return cfg.min_len <= prompt_len <= cfg.max_prompt_len and prompt_len < cfg.max_total_len


def _fits(prompt_len: int, output_len: int, cfg: SampleConfig) -> bool:
    return (prompt_len >= cfg.min_len and output_len >= cfg.min_len
            and prompt_len <= cfg.max_prompt_len and prompt_len + output_len <= cfg.max_total_len)


def _candidate_order(samples: Sequence[Sample], cfg: SampleConfig) -> list[int]:
    rng = random.Random(cfg.seed)
    if not cfg.contiguous:
        order = list(range(len(samples)))
        rng.shuffle(order)
        return order
    by_time = sorted(range(len(samples)), key=lambda i: samples[i].timestamp or 0.0)
    # No wrap-around: rows from before the window would break its arrival pattern.
    return by_time[rng.randrange(max(1, len(samples) - cfg.num_prompts + 1)):]


def sample_requests(samples: Sequence[Sample], cfg: SampleConfig, tokenizer: Any = None,
                    vocab_size: int | None = None, cache: TokenCache | None = None
                    ) -> list[tuple[BenchRequest, Sample]]:
    """``cfg.num_prompts`` requests (arrival offsets still 0) with the samples they came from;
    the same seed gives the same requests. ``cache`` (the tokenizer's) keeps token counts
    between runs: the same requests, without tokenizing texts counted before."""
    try:
        return _sample(samples, cfg, tokenizer, vocab_size, cache)
    finally:
        if cache is not None:
            cache.save()


def _sample(samples: Sequence[Sample], cfg: SampleConfig, tokenizer: Any,
            vocab_size: int | None, cache: TokenCache | None) -> list[tuple[BenchRequest, Sample]]:
    synth, chosen = None, []
    order = _candidate_order(samples, cfg)
    start = 0
    while start < len(order):
        # Tokenized in batches about as large as what is still missing (a few are wasted).
        size = min(_BATCH, max(8, cfg.num_prompts - len(chosen)))
        batch = order[start:start + size]
        start += size
        for index, (ids, output_len) in zip(batch, _lengths([samples[i] for i in batch],
                                                            tokenizer, cfg, cache)):
            sample = samples[index]
            prompt_len = len(ids) if ids is not None else _trace_prompt_len(sample, cfg)
            if not _fits(prompt_len, output_len, cfg):
                continue
            if ids is None:
                synth = synth or _Synthesiser(tokenizer, vocab_size, cfg.seed)
                ids = (synth.from_hashes(sample.hash_ids, prompt_len, cfg.trace_block_tokens)
                       if sample.hash_ids else synth.ids(index, prompt_len))
            request = BenchRequest(f"req-{len(chosen)}", ids, output_len, prompt=sample.prompt)
            chosen.append((request, sample))
            if len(chosen) == cfg.num_prompts:
                return chosen
    if cfg.repeat and chosen:
        return _cycled(chosen, cfg.num_prompts)
    raise ValueError(f"only {len(chosen)} of {len(samples)} records fit the length limits "
                     f"(prompt {cfg.min_len}..{cfg.max_prompt_len}, total <= {cfg.max_total_len}); "
                     f"asked for {cfg.num_prompts}")


def _trace_prompt_len(sample: Sample, cfg: SampleConfig) -> int:
    """A length-trace row's prompt length, scaled with its hash blocks."""
    n = sample.prompt_len or 0
    if not sample.hash_ids or cfg.trace_block_tokens == TRACE_BLOCK_TOKENS:
        return n
    return min(len(sample.hash_ids) * cfg.trace_block_tokens,
               -(-n * cfg.trace_block_tokens // TRACE_BLOCK_TOKENS))


def _cycled(chosen: list[tuple[BenchRequest, Sample]], n: int) -> list[tuple[BenchRequest, Sample]]:
    base = len(chosen)
    for i in range(base, n):
        request, sample = chosen[i % base]
        chosen.append((dataclasses.replace(request, request_id=f"req-{i}"), sample))
    return chosen


def build_workload(name: str, chosen: Sequence[tuple[BenchRequest, Sample]],
                   arrivals: ArrivalConfig) -> Workload:
    """The chosen requests timed by ``arrivals`` and put in arrival order."""
    if arrivals.use_trace_timestamps:
        offsets = trace_offsets([s.timestamp for _, s in chosen], arrivals.trace_time_scale)
    else:
        offsets = synthetic_offsets(len(chosen), arrivals.request_rate, arrivals.burstiness,
                                    arrivals.seed)
    timed = [dataclasses.replace(r, arrival_offset=t) for (r, _), t in zip(chosen, offsets)]
    return Workload(name, tuple(sorted(timed, key=lambda r: r.arrival_offset)))
