"""Scheduler configuration."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SchedulerConfig:
    num_gpu_blocks: int
    block_size: int = 16
    max_model_len: int = 2048
    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 256
    enable_chunked_prefill: bool = True
    policy: str = "vllm"
    # ``key=value`` options of the policy (``--policy-config``), checked against its config.
    policy_config: tuple[str, ...] = ()
    # Share full KV blocks of identical prefixes between requests and keep freed ones cached.
    enable_prefix_caching: bool = True
    # What besides the tokens determines a block's KV (model, dtype, adapter): the root of
    # every cached prefix, so two configurations never share KV.
    cache_namespace: tuple[str, ...] = ()
    # Host blocks the prefix cache may keep, out of the host KV tier (``prefix_host``); 0: none.
    prefix_cache_host_blocks: int = 0

    def __post_init__(self) -> None:
        positive = ("num_gpu_blocks", "block_size", "max_model_len", "max_num_batched_tokens",
                    "max_num_seqs")
        for name in positive:
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.prefix_cache_host_blocks < 0:
            raise ValueError(f"prefix_cache_host_blocks must be >= 0, got "
                             f"{self.prefix_cache_host_blocks}")
        # A request that may grow to max_model_len must fit in the pool on its own, or the
        # recompute-preemption loop could evict it forever without making progress.
        if self.max_model_len > self.kv_capacity_tokens:
            raise ValueError(
                f"max_model_len {self.max_model_len} exceeds the KV cache capacity of "
                f"{self.kv_capacity_tokens} tokens ({self.num_gpu_blocks} blocks of "
                f"{self.block_size}); lower max_model_len or add blocks")

    @property
    def kv_capacity_tokens(self) -> int:
        return self.num_gpu_blocks * self.block_size

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)
