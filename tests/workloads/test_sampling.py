"""Choosing N requests: determinism, token counting, length limits, synthesised prompts."""
from __future__ import annotations

import math
from typing import ClassVar

import pytest

from lenserve.workloads import ArrivalConfig, Sample, SampleConfig, build_workload, sample_requests


class WordTokenizer:
    """One token per word, BOS (id 1) as the only special token."""

    all_special_ids: ClassVar[list[int]] = [1]

    def __init__(self):
        self.vocab: dict[str, int] = {}

    def __len__(self) -> int:
        return 1000

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids = [self.vocab.setdefault(w, 2 + len(self.vocab)) for w in text.split()]
        return [1] + ids if add_special_tokens else ids


def text_samples(n: int) -> list[Sample]:
    return [Sample(prompt=" ".join(f"p{i}w{j}" for j in range(4 + i % 5)),
                   reference=" ".join(["r"] * (4 + i % 7))) for i in range(n)]


def test_lengths_are_counted_in_the_tokenizer():
    chosen = sample_requests(text_samples(30), SampleConfig(num_prompts=10), WordTokenizer())
    for request, sample in chosen:
        assert request.prompt_token_ids[0] == 1                    # as the engine sees it
        assert request.prompt_len == len(sample.prompt.split()) + 1
        assert request.output_len == len(sample.reference.split())  # generated tokens only
        assert request.prompt == sample.prompt


def test_same_seed_same_requests_other_seed_others():
    def pick(seed):
        chosen = sample_requests(text_samples(40), SampleConfig(num_prompts=8, seed=seed), WordTokenizer())
        return [s.prompt for _, s in chosen]

    assert pick(3) == pick(3)
    assert pick(3) != pick(4)


def test_length_limits_follow_vllm():
    samples = [Sample(prompt="a b", reference="x y z w"),              # prompt 3 < 4 tokens
               Sample(prompt="a b c d", reference="x y"),              # output 2 < 4
               Sample(prompt=" ".join(["a"] * 20), reference="x y z w"),
               Sample(prompt="a b c d", reference=" ".join(["x"] * 20)),
               Sample(prompt="a b c d e", reference="x y z w")]
    cfg = SampleConfig(num_prompts=1, max_prompt_len=10, max_total_len=20)
    ((_, sample),) = sample_requests(samples, cfg, WordTokenizer())
    assert sample is samples[4]


def test_fixed_output_len_overrides_the_reference():
    chosen = sample_requests(text_samples(5), SampleConfig(num_prompts=5, fixed_output_len=9), WordTokenizer())
    assert {r.output_len for r, _ in chosen} == {9}


def test_length_traces_get_synthesised_prompts():
    samples = [Sample(prompt_len=6 + i, output_len=5 + i) for i in range(10)]
    chosen = sample_requests(samples, SampleConfig(num_prompts=10), WordTokenizer())
    for request, sample in chosen:
        assert request.prompt_len == sample.prompt_len and request.output_len == sample.output_len
        assert all(0 <= t < 1000 and t != 1 for t in request.prompt_token_ids)
        assert request.prompt is None
    again = sample_requests(samples, SampleConfig(num_prompts=10), WordTokenizer())
    assert [r.prompt_token_ids for r, _ in chosen] == [r.prompt_token_ids for r, _ in again]


def test_synthesis_without_a_tokenizer_needs_a_vocab_size():
    samples = [Sample(prompt_len=8, output_len=8)]
    with pytest.raises(ValueError, match="vocabulary size"):
        sample_requests(samples, SampleConfig(num_prompts=1))
    ((request, _),) = sample_requests(samples, SampleConfig(num_prompts=1), vocab_size=50)
    assert max(request.prompt_token_ids) < 50


def test_text_datasets_need_a_tokenizer():
    with pytest.raises(ValueError, match="tokenizer is needed"):
        sample_requests(text_samples(3), SampleConfig(num_prompts=1))


def test_too_few_usable_records_is_an_error():
    with pytest.raises(ValueError, match="only 3 of 3 records fit"):
        sample_requests(text_samples(3), SampleConfig(num_prompts=5), WordTokenizer())
    with pytest.raises(ValueError, match="--num-prompts must be >= 1"):
        SampleConfig(num_prompts=0)


def test_contiguous_window_keeps_the_trace_pattern():
    samples = [Sample(prompt_len=8, output_len=8, timestamp=10.0 + 2 * i) for i in range(50)]
    chosen = sample_requests(samples, SampleConfig(num_prompts=5, seed=1, contiguous=True), vocab_size=100)
    times = [s.timestamp for _, s in chosen]
    assert times == [times[0] + 2 * i for i in range(5)]
    workload = build_workload("t", chosen, ArrivalConfig(use_trace_timestamps=True, trace_time_scale=0.5))
    assert [r.arrival_offset for r in workload.requests] == [0.0, 1.0, 2.0, 3.0, 4.0]


def test_build_workload_with_a_rate_orders_requests_by_arrival():
    chosen = sample_requests(text_samples(10), SampleConfig(num_prompts=10), WordTokenizer())
    workload = build_workload("w", chosen, ArrivalConfig(request_rate=5.0, seed=2))
    offsets = [r.arrival_offset for r in workload.requests]
    assert offsets == sorted(offsets) and offsets[-1] > 0
    assert workload.total_output_tokens == sum(r.output_len for r, _ in chosen)
    burst = build_workload("w", chosen, ArrivalConfig(request_rate=math.inf))
    assert {r.arrival_offset for r in burst.requests} == {0.0}


def test_trace_timing_needs_timestamps():
    chosen = sample_requests(text_samples(3), SampleConfig(num_prompts=3), WordTokenizer())
    with pytest.raises(ValueError, match="no arrival timestamps"):
        build_workload("w", chosen, ArrivalConfig(use_trace_timestamps=True))


def test_real_tokenizer_counts_match_its_encoding():
    from services.executor.models.loader import preset_tokenizer

    tok = preset_tokenizer()
    samples = [Sample(prompt="Explain how a paged KV cache works.",
                      reference="It stores keys and values in fixed-size blocks.")]
    ((request, _),) = sample_requests(samples, SampleConfig(num_prompts=1), tok)
    assert request.output_len == len(tok.encode(samples[0].reference, add_special_tokens=False))
    assert list(request.prompt_token_ids) == tok.encode(samples[0].prompt)


def test_batched_counting_matches_one_text_at_a_time():
    from services.executor.models.loader import preset_tokenizer

    tok = preset_tokenizer()
    words = ["paged", "attention", "keeps", "the", "kv", "cache", "in", "blocks"]
    samples = [Sample(prompt=" ".join(words[: 1 + i % 9] * (1 + i % 4)),
                      reference=" ".join(words[i % 5:] * (1 + i % 3))) for i in range(60)]
    cfg = SampleConfig(num_prompts=25, seed=4, max_prompt_len=20, max_total_len=40)
    chosen = sample_requests(samples, cfg, tok)
    expected = []
    for i in _order(len(samples), cfg.seed):       # the same filter, one text per call
        prompt = tok.encode(samples[i].prompt)
        output_len = len(tok.encode(samples[i].reference, add_special_tokens=False))
        if 4 <= len(prompt) <= 20 and output_len >= 4 and len(prompt) + output_len <= 40:
            expected.append((tuple(prompt), output_len, samples[i].prompt))
    assert len(chosen) == 25
    assert [(r.prompt_token_ids, r.output_len, r.prompt) for r, _ in chosen] == expected[:25]


def _order(n: int, seed: int) -> list[int]:
    import random
    order = list(range(n))
    random.Random(seed).shuffle(order)
    return order
