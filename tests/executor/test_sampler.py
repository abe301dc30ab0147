"""Sampling: greedy, top-k/top-p support, seeded determinism independent of the batch."""
from __future__ import annotations

import pytest
import torch

from lenserve_contract.sampling_params import SamplingParams
from services.executor.sampler import Sampler, SampleRequest, top_k_filter, top_p_filter


def req(**kw) -> SampleRequest:
    n = kw.pop("n", 0)
    return SampleRequest(SamplingParams(**kw), n)


@pytest.mark.parametrize("vocab", [50, 50272])
def test_greedy_is_the_argmax_of_each_row(vocab):
    logits = torch.randn(5, vocab)
    out = Sampler().sample(logits, [req(temperature=0.0)] * 5)
    tokens, logprobs = out.tokens, out.logprobs
    assert tokens == logits.argmax(-1).tolist()
    want = torch.log_softmax(logits, -1).max(-1).values
    assert torch.allclose(torch.tensor(logprobs), want)


@pytest.mark.parametrize("vocab", [100, 50272])
def test_top_k_samples_only_the_k_most_likely(vocab):
    logits = torch.randn(1, vocab)
    top = set(logits[0].topk(3).indices.tolist())
    sampler = Sampler(seed=1)
    draws = {sampler.sample(logits, [req(temperature=5.0, top_k=3)]).tokens[0] for _ in range(200)}
    assert draws <= top and len(draws) > 1


def test_top_k_filter_keeps_the_values_a_full_sort_keeps():
    probs = torch.softmax(torch.randn(4, 50272) * 3, dim=-1)
    probs[3, :7] = probs[3].max()          # ties at the k-th value are kept, as by a sort
    ks = [3, -1, 40, 5]
    kth = probs.sort(dim=-1, descending=True).values
    for row, k in enumerate(ks):
        want = probs[row] >= kth[row, k - 1] if k > 0 else torch.ones(50272, dtype=torch.bool)
        assert torch.equal(top_k_filter(probs, ks)[row] > 0, want), row


def test_top_p_keeps_the_smallest_set_reaching_p():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05], [0.05, 0.9, 0.03, 0.02]])
    kept = top_p_filter(probs, [0.7, 0.5]) > 0
    assert kept.tolist() == [[True, True, False, False], [False, True, False, False]]
    assert (top_k_filter(probs, [2, -1]) > 0).sum(-1).tolist() == [2, 4]


def test_top_p_draws_stay_in_the_nucleus():
    logits = torch.log(torch.tensor([[0.6, 0.3, 0.06, 0.04]]))
    sampler = Sampler(seed=2)
    draws = {sampler.sample(logits, [req(top_p=0.8)]).tokens[0] for _ in range(200)}
    assert draws == {0, 1}


def test_seeded_tokens_do_not_depend_on_the_batch():
    logits = torch.randn(4, 1000)
    alone = Sampler(seed=0).sample(logits[2:3], [req(seed=7, n=3)]).tokens[0]
    batch = [req(temperature=0.0), req(), req(seed=7, n=3), req(seed=8)]
    together = Sampler(seed=99).sample(logits, batch).tokens[2]
    assert alone == together


def test_seeded_tokens_advance_with_the_output_count():
    logits = torch.zeros(1, 1000)  # uniform: only the seed decides
    draws = [Sampler().sample(logits, [req(seed=5, n=n)]).tokens[0] for n in range(6)]
    again = [Sampler().sample(logits, [req(seed=5, n=n)]).tokens[0] for n in range(6)]
    assert draws == again and len(set(draws)) > 1


def test_unseeded_draws_vary():
    sampler = Sampler(seed=0)
    logits = torch.zeros(1, 1000)
    assert len({sampler.sample(logits, [req()]).tokens[0] for _ in range(10)}) > 1
