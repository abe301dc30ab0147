"""A real device KV pool behind a tiny mover that can be held back or made to fail."""
from __future__ import annotations

import threading

import torch

from services.executor.kv_cache import KVCachePool
from services.executor.types import ModelInfo
from services.kvmanager.config import KVManagerConfig
from services.kvmanager.core import InProcessKVManager
from services.kvmanager.host_pool import host_block_bytes as layout_block_bytes
from services.kvmanager.host_store import BlockLayout

LAYERS, BLOCK, HEADS, DIM = 2, 16, 2, 8


class TinyMover:
    """Moves blocks of a ``KVCachePool``. ``gate`` (cleared) holds every copy back until set;
    ``fail`` makes the next copies raise."""

    def __init__(self, pool: KVCachePool):
        self.pool = pool
        self.gate = threading.Event()
        self.gate.set()
        self.fail: str | None = None
        self.calls = 0

    def export_blocks(self, block_ids, out=None):
        self._enter()
        return self.pool.export_blocks(block_ids, out)

    def import_blocks(self, block_ids, data):
        self._enter()
        self.pool.import_blocks(block_ids, data)

    def export_blocks_int8(self, block_ids, num_tokens=None, out=None):
        self._enter()
        return self.pool.export_blocks_int8(block_ids, num_tokens, out)

    def import_blocks_int8(self, block_ids, data):
        self._enter()
        self.pool.import_blocks_int8(block_ids, data)

    def _enter(self):
        self.gate.wait()
        self.calls += 1
        if self.fail:
            raise RuntimeError(self.fail)


def make_pool(num_blocks: int = 16, dtype: torch.dtype = torch.float32,
              seed: int = 0) -> KVCachePool:
    pool = KVCachePool(LAYERS, num_blocks, BLOCK, HEADS, DIM, dtype)
    gen = torch.Generator().manual_seed(seed)
    pool.cache.copy_(torch.randn(pool.cache.shape, generator=gen) * 3 + 1)
    return pool


def model_info(pool: KVCachePool) -> ModelInfo:
    dtype = str(pool.cache.dtype).removeprefix("torch.")
    return ModelInfo(name="tiny", family="opt", vocab_size=100, num_layers=pool.num_layers,
                     num_heads=pool.num_kv_heads, num_kv_heads=pool.num_kv_heads,
                     head_dim=pool.head_dim, max_model_len=64, block_size=pool.block_size,
                     num_gpu_blocks=pool.num_blocks, bytes_per_block=pool.block_bytes,
                     eos_token_id=None, dtype=dtype, attention_backend="torch")


def host_block_bytes(pool: KVCachePool, int8: bool) -> int:
    return layout_block_bytes(BlockLayout.from_model_info(model_info(pool)), int8)


def make_manager(pool: KVCachePool, host_blocks: int, int8: bool = False,
                 **config) -> tuple[InProcessKVManager, TinyMover]:
    """A manager whose host pool holds exactly ``host_blocks`` blocks."""
    gib = host_blocks * host_block_bytes(pool, int8) / (1 << 30)
    mover = TinyMover(pool)
    manager = InProcessKVManager(KVManagerConfig(gib, int8=int8, **config), mover,
                                 model_info(pool))
    assert manager.num_host_blocks == host_blocks
    return manager, mover
