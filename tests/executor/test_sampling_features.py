"""The sampler's added parameters, each against a reference: penalties against a plain loop
(OpenAI's formula; Hugging Face's repetition processor), logprobs against log_softmax,
min_p and logit_bias by what they allow, seeds against a different batch."""
from __future__ import annotations

import pytest
import torch

from lenserve_contract.sampling_params import SamplingParams
from services.executor.logits_processors import apply_penalties
from services.executor.sampler import Penalties, Sampler, SampleRequest


def req(n: int = 0, **kw) -> SampleRequest:
    return SampleRequest(SamplingParams(**kw), n)


def reference_penalties(logits, prompt, outputs, presence, frequency, repetition):
    """One row, token by token: the repetition penalty over prompt and output tokens (as
    transformers' RepetitionPenaltyLogitsProcessor), then OpenAI's
    ``logit - count * frequency - (count > 0) * presence`` over the output tokens."""
    from transformers import RepetitionPenaltyLogitsProcessor
    out = logits.clone()
    seen = sorted(set(prompt) | set(outputs))
    if seen:
        out = RepetitionPenaltyLogitsProcessor(repetition)(torch.tensor([seen]), out[None])[0]
    for token in set(outputs):
        count = outputs.count(token)
        out[token] -= count * frequency + presence
    return out


def penalty_tensors(histories, vocab):
    counts = torch.zeros(len(histories), vocab, dtype=torch.int32)
    mask = torch.zeros(len(histories), vocab, dtype=torch.bool)
    for i, (prompt, outputs) in enumerate(histories):
        for t in outputs:
            counts[i, t] += 1
        mask[i, prompt] = True
    return counts, mask


def test_penalties_match_the_reference():
    gen = torch.Generator().manual_seed(0)
    vocab = 50
    logits = torch.randn(3, vocab, generator=gen) * 3
    histories = [([1, 2, 3], [4, 4, 5, 1]), ([7, 7], []), ([], [9, 9, 9, 2])]
    settings = [(0.5, 0.25, 1.3), (-1.0, 2.0, 0.7), (2.0, -0.5, 1.0)]
    params = [SamplingParams(presence_penalty=p, frequency_penalty=f, repetition_penalty=r)
              for p, f, r in settings]
    counts, mask = penalty_tensors(histories, vocab)
    got = apply_penalties(logits, counts, mask, params)
    for i, ((prompt, outputs), (p, f, r)) in enumerate(zip(histories, settings)):
        want = reference_penalties(logits[i], prompt, outputs, p, f, r)
        assert torch.allclose(got[i], want, atol=1e-5), i


def test_a_strong_penalty_changes_the_greedy_choice():
    logits = torch.tensor([[5.0, 4.0, 0.0, 0.0]])
    counts, mask = penalty_tensors([([], [0, 0])], 4)
    plain = Sampler().sample(logits, [req(temperature=0)]).tokens
    penalized = Sampler().sample(logits, [req(temperature=0, frequency_penalty=1.0)],
                                 Penalties([0], counts, mask)).tokens
    assert plain == [0] and penalized == [1]


def test_logprobs_are_the_raw_log_softmax_and_its_top_k():
    logits = torch.randn(4, 100)
    reqs = [req(temperature=0, logprobs=5), req(logprobs=0), req(), req(temperature=0.7,
                                                                        logprobs=20)]
    out = Sampler(seed=1).sample(logits, reqs)
    ref = torch.log_softmax(logits, -1)
    for row, token in enumerate(out.tokens):
        assert out.logprobs[row] == pytest.approx(ref[row, token].item(), abs=1e-5)
    assert set(out.top) == {0, 1, 3} and out.top[1] == []
    for row, k in ((0, 5), (3, 20)):
        vals, ids = ref[row].topk(k)
        assert [t for t, _ in out.top[row]] == ids.tolist()
        assert [lp for _, lp in out.top[row]] == pytest.approx(vals.tolist(), abs=1e-5)


def test_logit_bias_forces_and_forbids_tokens():
    logits = torch.zeros(2, 30)
    reqs = [req(logit_bias={7: 100.0}), req(temperature=0, logit_bias={0: -100.0})]
    for _ in range(20):
        tokens = Sampler().sample(logits, reqs).tokens
        assert tokens[0] == 7 and tokens[1] != 0


def test_min_p_drops_the_unlikely_tokens():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    sampler = Sampler(seed=3)
    draws = {sampler.sample(logits, [req(min_p=0.5)]).tokens[0] for _ in range(300)}
    assert draws == {0, 1}     # 0.15 and 0.05 are under half of 0.5


def test_a_seed_gives_the_same_tokens_in_any_batch_with_every_option():
    gen = torch.Generator().manual_seed(4)
    logits = torch.randn(5, 500, generator=gen)
    mine = dict(seed=11, min_p=0.01, top_k=50, top_p=0.95, logit_bias={3: 2.0}, logprobs=2,
                temperature=0.9)
    counts, mask = penalty_tensors([([1, 2], [3, 3])], 500)
    alone = Sampler().sample(logits[2:3], [req(4, presence_penalty=0.3, **mine)],
                             Penalties([0], counts, mask))
    others = [req(temperature=0), req(), req(4, presence_penalty=0.3, **mine), req(seed=2),
              req(logprobs=3)]
    together = Sampler().sample(logits, others, Penalties([2], counts, mask))
    assert alone.tokens[0] == together.tokens[2] and alone.top[0] == together.top[2]


def test_unseeded_samplers_start_from_fresh_entropy():
    logits = torch.zeros(1, 10_000)
    first = [Sampler().sample(logits, [req()]).tokens[0] for _ in range(5)]
    assert len(set(first)) > 1      # a stream fixed at start would repeat one token
