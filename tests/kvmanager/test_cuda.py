"""The CUDA path: pinned host pool, copies on a side stream ordered after the compute stream."""
from __future__ import annotations

import pytest
import torch

from services.executor.kv_cache import KVCachePool
from services.kvmanager.config import KVManagerConfig
from services.kvmanager.core import InProcessKVManager
from services.kvmanager.int8 import element_scale, quantize
from tests.kvmanager.helpers import BLOCK, DIM, HEADS, LAYERS, model_info

pytestmark = pytest.mark.gpu


def cuda_pool(dtype=torch.float16) -> KVCachePool:
    pool = KVCachePool(LAYERS, 32, BLOCK, HEADS, DIM, dtype, device="cuda")
    pool.cache.normal_()
    return pool


@pytest.mark.parametrize("int8", [False, True])
def test_round_trip_on_a_cuda_pool(int8):
    pool = cuda_pool()
    manager = InProcessKVManager(KVManagerConfig(0.01, int8=int8), pool, model_info(pool),
                                 device="cuda")
    original = pool.cache[:, :, [3, 9]].cpu()
    manager.swap_out("r", [3, 9]).wait()
    pool.cache[:, :, [3, 9, 20, 21]] = 0
    manager.swap_in("r", [21, 20]).wait()
    arrived = pool.cache[:, :, [21, 20]].cpu()
    if int8:    # quantized on the GPU before the copy: within the bound of the CPU's codes
        step = element_scale(quantize(original))
        assert ((arrived.float() - original.float()).abs() <= step * 1.01).all()
        assert manager.stats().link_bytes_out * 1.9 <= manager.stats().bytes_swapped_out
    else:
        assert torch.equal(arrived, original)
    manager.check_integrity()
    manager.close()


def test_swap_out_reads_what_the_compute_stream_queued_before_it():
    pool = cuda_pool(torch.float32)
    manager = InProcessKVManager(KVManagerConfig(0.01), pool, model_info(pool), device="cuda")
    a = torch.randn(2048, 2048, device="cuda")
    for _ in range(20):                     # keep the compute stream busy
        a = torch.tanh(a @ a)
    pool.cache[:, :, 5] = a.flatten()[:pool.cache[:, :, 5].numel()].view_as(pool.cache[:, :, 5])
    handle = manager.swap_out("r", [5])     # no synchronize: the side stream must wait
    handle.wait()
    expected = pool.cache[:, :, 5].cpu()
    pool.cache[:, :, 6] = 0
    manager.swap_in("r", [6]).wait()
    assert torch.equal(pool.cache[:, :, 6].cpu(), expected)
    manager.close()


def test_a_strided_host_run_is_exported_and_imported_exactly():
    """A run of blocks of a host pool laid out [layers, 2, blocks, ...] is a strided view: the
    pool copies it one [layer, k] slice at a time (each contiguous), and the bytes are exact."""
    pool = cuda_pool(torch.bfloat16)
    host = torch.zeros((pool.num_layers, 2, 10, *pool.cache.shape[3:]), dtype=pool.cache.dtype,
                       pin_memory=True)
    run = host[:, :, 3:7]
    assert not run.is_contiguous() and run[0, 0].is_contiguous()
    ids = [9, 2, 30, 17]
    pool.export_blocks(ids, out=run)
    assert torch.equal(run, pool.cache[:, :, ids].cpu())
    assert not host[:, :, :3].any() and not host[:, :, 7:].any()
    pool.import_blocks([0, 1, 5, 6], run)
    assert torch.equal(pool.cache[:, :, [0, 1, 5, 6]].cpu(), pool.cache[:, :, ids].cpu())
