"""Assembles a serving core from one frozen config: the executor, the predictor and the KV
manager it names. The thin shells (``lenserve.LLM``, ``AsyncEngine``, the scheduler
service's ``__main__``) call this; the core itself only sees the interfaces."""
from __future__ import annotations

import logging
from dataclasses import dataclass

from services.executor import factory
from services.executor.factory import FAKE_MODEL  # noqa: F401 - re-exported
from services.executor.interface import Executor
from services.scheduler.config import SchedulerConfig

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EngineConfig:
    model: str
    policy: str = "vllm"
    policy_config: tuple[str, ...] = ()      # key=value options of the policy
    block_size: int = 16
    num_gpu_blocks: int | None = None
    kv_cache_memory_bytes: int | None = None
    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 256
    enable_chunked_prefill: bool = True
    attention_backend: str = "auto"
    dtype: str = "auto"                       # services.hardware.DTYPE_AUTO_HELP
    device: str = "cpu"
    enforce_eager: bool = False               # no CUDA graphs for decode
    max_model_len: int | None = None
    seed: int = 0
    skip_tokenizer_init: bool = False         # run on prompt_token_ids only (no tokenizer)
    # none | embedded | embedded:DIR | oracle | grpc://HOST:PORT
    predictor: str = "none"
    predictor_seed: str | None = None         # {"prompt","output_len"} JSON lines; None: bundled
    kafka_bootstrap: str | None = None        # completions go to the Kafka topic, not observe()
    kafka_max_buffered: int = 10_000          # records kept while Kafka is down; then oldest dropped
    swap_space_gib: float = 0.0               # host KV tier (0: none; swapping is refused)
    enable_prefix_caching: bool = True        # share and keep KV of identical prompt prefixes
    # Host blocks of the swap space the prefix cache may keep evicted blocks in (0: none).
    # One host budget: the prefix cache uses swap space no swapped request needs, and a swap
    # evicts its entries rather than being refused; this caps its share.
    prefix_cache_host_blocks: int = 0
    kv_int8: bool = False                     # channel-wise INT8 for swapped KV
    check_integrity: bool = False    # assert block accounting after every step (tests)

    def __post_init__(self) -> None:
        if isinstance(self.policy_config, list):
            object.__setattr__(self, "policy_config", tuple(self.policy_config))
        if self.kafka_max_buffered < 1:
            raise ValueError(f"kafka_max_buffered must be >= 1, got {self.kafka_max_buffered}")
        if self.swap_space_gib < 0:
            raise ValueError(f"swap_space_gib must be >= 0, got {self.swap_space_gib}")
        # --kv-int8 and the policy's kv_int8 option are one setting; it acts on the host tier.
        from services.scheduler.policies import wants_kv_int8
        int8 = wants_kv_int8(self.policy, list(self.policy_config), self.kv_int8)
        if int8 and self.swap_space_gib <= 0:
            raise ValueError("kv_int8 (--kv-int8 or the policy's kv_int8 option) compresses "
                             "the host KV tier: give it one with swap_space_gib > 0")
        object.__setattr__(self, "kv_int8", int8)
        if self.prefix_cache_host_blocks and (self.swap_space_gib <= 0
                                              or not self.enable_prefix_caching):
            raise ValueError("prefix_cache_host_blocks keeps cached prefixes in the host KV "
                             "tier: it needs prefix caching on and swap_space_gib > 0")


def build_executor(config: EngineConfig) -> Executor:
    return factory.build_executor(factory.ExecutorConfig(
        config.model, block_size=config.block_size, num_gpu_blocks=config.num_gpu_blocks,
        kv_cache_memory_bytes=config.kv_cache_memory_bytes,
        attention_backend=config.attention_backend, dtype=config.dtype, device=config.device,
        max_model_len=config.max_model_len, seed=config.seed,
        skip_tokenizer_init=config.skip_tokenizer_init, enforce_eager=config.enforce_eager))


def scheduler_config(config: EngineConfig, executor: Executor) -> SchedulerConfig:
    info = executor.model_info()
    capacity = info.num_gpu_blocks * info.block_size
    # Unless asked otherwise, the context is what the model allows and the KV pool can hold.
    max_len = config.max_model_len or min(info.max_model_len, capacity)
    return SchedulerConfig(
        num_gpu_blocks=info.num_gpu_blocks, block_size=info.block_size, max_model_len=max_len,
        max_num_batched_tokens=config.max_num_batched_tokens, max_num_seqs=config.max_num_seqs,
        enable_chunked_prefill=config.enable_chunked_prefill, policy=config.policy,
        policy_config=config.policy_config, enable_prefix_caching=config.enable_prefix_caching,
        cache_namespace=(info.name, info.dtype),
        prefix_cache_host_blocks=config.prefix_cache_host_blocks)


def build_predictions(config: EngineConfig, model: str, progress=None):
    """The PredictionPump for ``config.predictor`` (None for ``none``), with completions sent
    to Kafka when a bootstrap server is set (see ``CompletionPublisher``)."""
    from services.predictor.local import make_predictor
    from services.scheduler.predictions import PredictionPump

    predictor = make_predictor(config.predictor, model, config.predictor_seed, progress)
    if predictor is None:
        return None
    if not config.kafka_bootstrap:
        return PredictionPump(predictor, model)
    # Buffered, on a thread of its own: Kafka being down never holds up serving.
    from services.predictor.kafka_publisher import CompletionPublisher
    publisher = CompletionPublisher(config.kafka_bootstrap, max_buffered=config.kafka_max_buffered)
    return PredictionPump(predictor, model, publisher.publish, on_close=publisher.close,
                          publisher=publisher)


def build_kv_manager(config: EngineConfig, executor: Executor):
    if config.swap_space_gib <= 0:
        return None
    from services.kvmanager.config import KVManagerConfig
    from services.kvmanager.core import InProcessKVManager
    return InProcessKVManager(KVManagerConfig(config.swap_space_gib, int8=config.kv_int8),
                              executor, executor.model_info())


def engine_parts(config: EngineConfig, executor: Executor | None = None,
                 predictor_progress=None, kv_manager=None) -> dict:
    """Keyword arguments of ``EngineCore`` for this config (executor built unless given; the
    KV manager too, from ``swap_space_gib``, unless one is given, e.g. a gRPC client)."""
    executor = executor if executor is not None else build_executor(config)
    model = executor.model_info().name
    if kv_manager is None:
        kv_manager = build_kv_manager(config, executor)
    return {"scheduler_config": scheduler_config(config, executor), "executor": executor,
                "predictions": build_predictions(config, model, predictor_progress),
                "kv_manager": kv_manager, "check_integrity": config.check_integrity}
