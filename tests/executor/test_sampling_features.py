"""The sampler's added parameters, each against a reference: penalties against a plain loop
(OpenAI's formula; Hugging Face's repetition processor), logprobs against log_softmax,
min_p and logit_bias by what they allow, seeds against a different batch."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from lenserve_contract.sampling_params import SamplingParams
from services.executor.logits_processors import apply_penalties
from services.executor.sampler import Sampler, SampleRequest
from services.executor.sampling_state import SamplingState
from services.executor.types import ScheduledSequence


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


def penalties_of(histories, params):
    """The sampler's penalty input for rows with (prompt, outputs) histories, built by the
    executor's own per-request state."""
    state = SamplingState(torch.device("cpu"))
    seqs = [ScheduledSequence(f"r{i}", prompt + outputs or [0], 0, [0], True, p, len(outputs))
            for i, ((prompt, outputs), p) in enumerate(zip(histories, params))]
    state.observe(seqs)
    return state.prepare(seqs)[0]


def test_penalties_match_the_reference():
    gen = torch.Generator().manual_seed(0)
    vocab = 50
    logits = torch.randn(3, vocab, generator=gen) * 3
    histories = [([1, 2, 3], [4, 4, 5, 1]), ([7, 7], []), ([], [9, 9, 9, 2])]
    settings = [(0.5, 0.25, 1.3), (-1.0, 2.0, 0.7), (2.0, -0.5, 1.0)]
    params = [SamplingParams(presence_penalty=p, frequency_penalty=f, repetition_penalty=r)
              for p, f, r in settings]
    got = logits.clone()
    apply_penalties(got, *dataclasses.astuple(penalties_of(histories, params)))
    for i, ((prompt, outputs), (p, f, r)) in enumerate(zip(histories, settings)):
        want = reference_penalties(logits[i], prompt, outputs, p, f, r)
        assert torch.allclose(got[i], want, atol=1e-5), i


def test_a_strong_penalty_changes_the_greedy_choice():
    logits = torch.tensor([[5.0, 4.0, 0.0, 0.0]])
    plain = Sampler().sample(logits.clone(), [req(temperature=0)]).tokens
    params = req(temperature=0, frequency_penalty=1.0)
    penalized = Sampler().sample(logits, [params],
                                 penalties_of([([3], [0, 0])], [params.params])).tokens
    assert plain == [0] and penalized == [1]


@pytest.mark.parametrize("vocab", [100, 50272])    # PyTorch's topk; the staged one
def test_logprobs_are_the_raw_log_softmax_and_its_top_k(vocab):
    logits = torch.randn(4, vocab)
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
        tokens = Sampler().sample(logits.clone(), reqs).tokens
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
    me = req(4, presence_penalty=0.3, **mine)
    alone = Sampler().sample(logits[2:3].clone(), [me],
                             penalties_of([([1, 2], [3, 3])], [me.params]))
    others = [req(temperature=0), req(), me, req(seed=2), req(logprobs=3)]
    hist = [([5], []), ([5], []), ([1, 2], [3, 3]), ([5], []), ([5], [])]
    together = Sampler().sample(logits, others, penalties_of(hist, [r.params for r in others]))
    assert alone.tokens[0] == together.tokens[2] and alone.top[0] == together.top[2]


def test_unseeded_samplers_start_from_fresh_entropy():
    logits = torch.zeros(1, 10_000)
    first = [Sampler().sample(logits, [req()]).tokens[0] for _ in range(5)]
    assert len(set(first)) > 1      # a stream fixed at start would repeat one token


def test_seen_tokens_grow_past_their_first_capacity():
    from services.executor.sampling_state import SeenTokens
    seen = SeenTokens([1, 2], [])
    for t in range(100):
        seen.add(t % 40)
    counts = dict(zip(seen.tokens[:seen.n].tolist(), seen.counts[:seen.n].tolist()))
    assert seen.n == 40 and counts[1] == 3 and counts[39] == 2
