"""The staged argmax and top-k against PyTorch's own, on rows wide enough to take the staged
path: vocabularies that are and are not a multiple of the chunk, ties, infinities."""
from __future__ import annotations

import pytest
import torch

from services.executor import reductions
from services.executor.reductions import CHUNK, argmax_rows, topk_rows


def rows(vocab: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(9, vocab, generator=gen) * 4
    x[1, -1] = 100.0                       # the maximum in the short last chunk
    x[2, [5, CHUNK + 3, vocab - 2]] = 50.0  # tied maxima in three chunks: the first wins
    x[3] = 1.0                             # one value everywhere
    x[4, : vocab // 2] = float("-inf")     # a grammar mask's shape
    x[5, [17, 900, 901, vocab - 1]] = torch.tensor([9.0, 9.0, 8.0, 9.0])
    x[6] = torch.arange(vocab, dtype=torch.float32)   # the top-k all in the last chunk
    x[7] = -torch.arange(vocab, dtype=torch.float32)  # ... all in the first
    x[8] = x[8].round()                    # many ties below the top
    return x


@pytest.mark.parametrize("vocab", [50272, 32 * CHUNK, 8 * CHUNK + 1])
def test_argmax_is_torch_argmax(vocab):
    for seed in range(3):
        x = rows(vocab, seed)
        assert reductions._staged(x, 1)
        assert torch.equal(argmax_rows(x), x.argmax(dim=-1))


@pytest.mark.parametrize("vocab", [50272, 32 * CHUNK, 40 * CHUNK + 1])
@pytest.mark.parametrize("k", [1, 5, 8])
def test_topk_has_torch_topk_values_at_their_own_indices(vocab, k):
    for seed in range(3):
        x = rows(vocab, seed)
        assert reductions._staged(x, k)
        values, indices = topk_rows(x, k)
        assert torch.equal(values, x.topk(k, dim=-1).values)
        assert torch.equal(x.gather(1, indices), values)
        assert all(len(set(r)) == k for r in indices.tolist())      # k distinct tokens
        wider = x.topk(k + 1, dim=-1).values.tolist()   # no tie among or after the top k
        untied = [i for i, w in enumerate(wider) if len(set(w)) == k + 1]
        assert torch.equal(indices[untied], x[untied].topk(k, dim=-1).indices)


def test_narrow_rows_and_wide_k_use_torch_directly():
    x = torch.randn(3, 100)
    assert not reductions._staged(x, 1)
    assert not reductions._staged(torch.randn(2, 50272), 200)
    assert torch.equal(topk_rows(x, 3)[1], x.topk(3).indices)
