"""TritonAttention against the PyTorch reference on random paged batches.

Without CUDA the kernels run in Triton's interpreter, which Triton selects when the kernels are
decorated, i.e. at import: the variable must be set before the backend module is imported.
"""
import os
import subprocess
import sys
from pathlib import Path

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest

from services.executor.attention.base import AttentionMetadata
from services.executor.attention.torch_backend import TorchAttention
from services.executor.attention.triton_backend import (
    KernelOptions,
    TritonAttention,
    choose_num_splits,
)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def make_batch(q_lens, seq_lens, block_size, num_heads, num_kv_heads, head_dim,
               dtype=torch.float32, device=DEVICE, seed=0):
    """Random q and a paged cache whose unused slots, unused blocks and table padding are NaN,
    so any read outside a sequence's context poisons the output."""
    gen = torch.Generator().manual_seed(seed)
    need = [-(-n // block_size) for n in seq_lens]
    num_blocks = sum(need) + 3
    order = torch.randperm(num_blocks, generator=gen).tolist()
    poison = order.pop()  # never owned: table padding points here
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.randn(shape, generator=gen)
    v_cache = torch.randn(shape, generator=gen)
    owned = torch.zeros(num_blocks, block_size, dtype=torch.bool)
    tables = []
    for seq_len, n in zip(seq_lens, need):
        table, order = order[:n], order[n:]
        owned.view(-1, block_size)[table] = torch.arange(n * block_size).view(n, -1) < seq_len
        tables.append(table)
    k_cache[~owned] = float("nan")
    v_cache[~owned] = float("nan")
    width = max(need) + 2
    tables = [t + [poison] * (width - len(t)) for t in tables]
    meta = AttentionMetadata.build(q_lens, seq_lens, tables, device)
    q = torch.randn(sum(q_lens), num_heads, head_dim, generator=gen)
    return (q.to(device, dtype), k_cache.to(device, dtype), v_cache.to(device, dtype), meta)


def check(q, k_cache, v_cache, meta, backend=None, atol=1e-4, rtol=1e-4):
    scale = q.shape[-1] ** -0.5
    ref = TorchAttention().forward(q.float(), k_cache.float(), v_cache.float(), meta, scale)
    out = (backend or TritonAttention()).forward(q, k_cache, v_cache, meta, scale)
    assert out.shape == q.shape and out.dtype == q.dtype
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.float(), ref, atol=atol, rtol=rtol)


# Decode rows, chunked-prefill chunks, a full prefill; lengths 1..~100, several exactly on a
# block boundary for every block size tested (multiples of 32), one sequence idle this step.
MIXED_Q_LENS = [1, 7, 1, 70, 1, 32, 0, 2]
MIXED_SEQ_LENS = [1, 40, 96, 70, 33, 64, 5, 100]


@pytest.mark.parametrize("block_size,num_heads,num_kv_heads,head_dim", [
    (8, 4, 4, 32),
    (16, 4, 2, 64),
    (32, 8, 1, 32),
    (12, 6, 2, 32),  # neither block size nor group a power of two
])
def test_mixed_batch_matches_reference(block_size, num_heads, num_kv_heads, head_dim):
    check(*make_batch(MIXED_Q_LENS, MIXED_SEQ_LENS, block_size, num_heads, num_kv_heads,
                      head_dim, seed=block_size))


@pytest.mark.parametrize("num_splits", [2, 4])
def test_split_kv_decode_matches_reference(num_splits):
    # seq_len 1 and 9 leave some splits empty; 100 spreads over all of them.
    batch = make_batch([1, 1, 1, 1], [1, 9, 64, 100], 8, 4, 2, 32, seed=num_splits)
    check(*batch, backend=TritonAttention(num_splits=num_splits,
                                          options=KernelOptions(decode_tile_n=16)))


def test_prefill_only_batch_with_small_tiles():
    # Small query tiles: a 50-token chunk spans many tiles, each with its own causal bound.
    batch = make_batch([50, 3], [90, 3], 16, 4, 1, 32, seed=3)
    check(*batch, backend=TritonAttention(
        options=KernelOptions(prefill_block_m=16, prefill_tile_n=16)))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_inputs(dtype):
    batch = make_batch([1, 9, 1], [17, 40, 64], 16, 4, 2, 32, dtype=dtype, seed=5)
    check(*batch, atol=2e-2, rtol=2e-2)


def test_wave_over_selected_sequences_matches_full_batch():
    q, k_cache, v_cache, meta = make_batch([1, 5, 1], [20, 30, 8], 8, 4, 2, 32, seed=7)
    full = TritonAttention().forward(q, k_cache, v_cache, meta, 0.2)
    sub, rows = meta.select([2, 1])
    part = TritonAttention().forward(q[rows], k_cache, v_cache, sub, 0.2)
    torch.testing.assert_close(part, full[rows])


def test_empty_batch_returns_empty():
    q, k_cache, v_cache, _ = make_batch([1], [4], 8, 4, 2, 32)
    meta = AttentionMetadata.build([], [], [], DEVICE)
    out = TritonAttention().forward(q[:0], k_cache, v_cache, meta, 1.0)
    assert out.shape == (0, 4, 32)


@pytest.mark.parametrize("change,match", [
    (lambda q, k, v: (q[:, :3], k, v), "heads"),
    (lambda q, k, v: (q, k.half(), v), "dtypes differ"),
    (lambda q, k, v: (q, k, v[:, :, :1]), "one shape"),
])
def test_bad_inputs_are_named(change, match):
    q, k_cache, v_cache, meta = make_batch([1, 3], [4, 9], 8, 4, 2, 32)
    with pytest.raises(ValueError, match=match):
        TritonAttention().forward(*change(q, k_cache, v_cache), meta, 1.0)


@pytest.mark.parametrize("kwargs", [
    {"num_splits": 3}, {"num_splits": 0}, {"options": KernelOptions(decode_tile_n=24)},
    {"options": KernelOptions(prefill_tile_n=8)}, {"options": KernelOptions(max_splits=6)}])
def test_bad_tuning_rejected(kwargs):
    with pytest.raises(ValueError, match="power of two"):
        TritonAttention(**kwargs)


def test_kernel_options_parse_and_refuse_unknown_keys():
    assert KernelOptions.parse(["decode_warps=8", "split_waves=4"]) == KernelOptions(
        decode_warps=8, split_waves=4)
    for bad in (["decode_warp=8"], ["decode_warps"], ["decode_warps=x"]):
        with pytest.raises(ValueError, match="bad kernel option"):
            KernelOptions.parse(bad)


def test_no_split_off_gpu():
    assert choose_num_splits(1, 1, 100_000, torch.device("cpu")) == 1


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-4), (torch.float16, 2e-2),
                                       (torch.bfloat16, 3e-2)])
@pytest.mark.parametrize("num_splits", [None, 1, 8])
def test_gpu_large_mixed_batch(dtype, tol, num_splits):
    gen = torch.Generator().manual_seed(11)
    q_lens = [1] * 24 + [300, 64, 1000]
    seq_lens = torch.randint(1, 1500, (24,), generator=gen).tolist() + [1800, 64, 1000]
    batch = make_batch(q_lens, seq_lens, 16, 32, 8, 128, dtype=dtype, seed=11)
    check(*batch, backend=TritonAttention(num_splits=num_splits), atol=tol, rtol=tol)


@pytest.mark.gpu
@gpu
def test_gpu_auto_split_for_few_long_sequences():
    assert choose_num_splits(2, 8, 32_768, torch.device("cuda")) > 1
    batch = make_batch([1, 1], [4000, 31], 16, 32, 8, 128, dtype=torch.float16, seed=12)
    check(*batch, atol=2e-2, rtol=2e-2)


MIXED_MODES_SCRIPT = """
import os
import torch
import triton.language  # Triton's helpers are decorated now, compiled
os.environ["TRITON_INTERPRET"] = "1"  # too late for them, in time for lenserve's kernels
from services.executor.attention.base import AttentionMetadata
from services.executor.attention.triton_backend import TritonAttention
meta = AttentionMetadata.build([1], [4], [[0]], "cpu")
cache = torch.zeros(1, 16, 1, 16)
try:
    TritonAttention().forward(torch.zeros(1, 1, 16), cache, cache, meta, 1.0)
except RuntimeError as exc:
    print(exc)
"""


@pytest.mark.skipif(torch.cuda.is_available(), reason="the no-GPU path")
def test_interpreter_set_after_triton_was_imported_is_named():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = Path(__file__).resolve().parents[2]
    env["PYTHONPATH"] = os.pathsep.join([str(root), env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, "-c", MIXED_MODES_SCRIPT], env=env, cwd=root,
                          capture_output=True, text=True, timeout=300, check=False)
    assert "TRITON_INTERPRET was set after triton was imported" in proc.stdout, proc.stderr
