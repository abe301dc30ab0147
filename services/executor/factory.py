"""One frozen config for an executor, and the executor it describes: the deterministic fake
(``model="fake"``) or the in-process model. The scheduler's wiring and the executor
service's ``__main__`` both build through here."""
from __future__ import annotations

from dataclasses import dataclass

from services.executor.interface import Executor

FAKE_MODEL = "fake"   # deterministic model-free executor (services/executor/fake.py)


@dataclass(frozen=True)
class ExecutorConfig:
    model: str
    block_size: int = 16
    num_gpu_blocks: int | None = None
    kv_cache_memory_bytes: int | None = None
    attention_backend: str = "auto"
    dtype: str = "auto"
    device: str = "cpu"
    max_model_len: int | None = None
    seed: int = 0
    skip_tokenizer_init: bool = False
    enforce_eager: bool = False


def build_executor(config: ExecutorConfig) -> Executor:
    if config.model == FAKE_MODEL:
        from services.executor.fake import FakeExecutor
        return FakeExecutor(num_gpu_blocks=config.num_gpu_blocks or 1024,
                            block_size=config.block_size,
                            max_model_len=config.max_model_len or 2048)
    # Imported lazily: the model code pulls in transformers and the attention kernels.
    from services.executor.runner import InProcessExecutor
    return InProcessExecutor(
        config.model, block_size=config.block_size, num_gpu_blocks=config.num_gpu_blocks,
        kv_cache_memory_bytes=config.kv_cache_memory_bytes,
        attention_backend=config.attention_backend, dtype=config.dtype, device=config.device,
        max_model_len=config.max_model_len, seed=config.seed,
        skip_tokenizer_init=config.skip_tokenizer_init, cuda_graphs=not config.enforce_eager)


def load_tokenizer(model: str):
    """The tokenizer an executor of ``model`` uses, without loading its weights (a scheduler
    in front of a remote executor tokenizes and detokenizes itself)."""
    if model == FAKE_MODEL:
        from services.executor.fake import CharTokenizer
        return CharTokenizer()
    from services.executor.models.naming import model_tokenizer
    return model_tokenizer(model)
