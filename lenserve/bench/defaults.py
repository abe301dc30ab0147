"""What ``lenserve bench`` runs when flags are left out, and the KV sizes it derives.

The defaults make a quick policy comparison that works out of the box on a CPU: the bundled
ShareGPT sample, a small built-in model, a KV pool small enough that requests queue (length-
aware scheduling only pays where they do) and the embedded predictor for the policies that
read predictions.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from lenserve.bench.backends import BackendSpec
from services.scheduler.wiring import EngineConfig

# The engine's KV block; ``lenserve bench`` has no flag for it.
BLOCK_SIZE = EngineConfig.block_size
# The context of every built-in model (their max_position_embeddings).
MODEL_CONTEXT = 2048


@dataclass(frozen=True)
class WorkloadDefaults:
    """Defaults of the workload flags ``bench`` and ``simulate`` share."""

    dataset_name: str = "lengths"
    num_prompts: int = 50
    request_rate: float = math.inf
    # None: derived from the KV pool (``kv_sizes``).
    max_model_len: int | None = MODEL_CONTEXT


# ``lenserve bench``: 50 of the bundled ShareGPT conversations sent at once into 64 blocks of
# 16 tokens (1,024 tokens, about 4 of the requests that fit the 512-token limit): requests
# queue for KV on any machine, however fast (a Poisson rate that queues on one CPU may not
# on another), so the policies' order is what the comparison shows. 50 keep opt-125m's run
# of two policies near a minute on a 2-core CPU. opt-125m rather than the 2-layer opt-tiny:
# on opt-tiny an iteration is ~1 ms, so the predictor's embedding work beside the engine
# weighs as much as the scheduling it informs.
BENCH_WORKLOAD = WorkloadDefaults(dataset_name="sharegpt", num_prompts=50, request_rate=math.inf,
                                  max_model_len=None)
BENCH_NUM_GPU_BLOCKS = 64
# Pool tokens per request of the derived limit: one request of the limit never fills the pool
# alone (a pool of one request serves one at a time, whatever the policy).
REQUESTS_PER_POOL = 2
# A host tier for preempted requests (as the policy comparisons in the README use): without
# one a preempted request recomputes its whole context, and a policy that reorders often pays
# for that instead of gaining from its order. 1 GiB is many times the default pool's KV.
BENCH_SWAP_SPACE_GIB = 1.0
# What a length-aware policy is given when --predictor is left out.
DEFAULT_LENGTH_PREDICTOR = "embedded"


@dataclass(frozen=True)
class KVSizes:
    max_model_len: int
    num_gpu_blocks: int
    note: str | None = None         # why max_model_len is below the model's context


def kv_sizes(max_model_len: int | None, num_gpu_blocks: int | None) -> KVSizes:
    """The context limit and the KV pool, never one that the other cannot hold.

    A request may grow to ``max_model_len`` and must fit in the pool on its own, so a limit
    above the pool is refused here, naming the flags, before any model loads. Left out, the
    limit is the model's context cut to ``1 / REQUESTS_PER_POOL`` of the pool, and the pool is
    ``BENCH_NUM_GPU_BLOCKS`` grown to hold ``REQUESTS_PER_POOL`` requests of the limit."""
    if num_gpu_blocks is not None and num_gpu_blocks < 1:
        raise ValueError(f"--num-gpu-blocks must be >= 1, got {num_gpu_blocks}")
    if max_model_len is not None and max_model_len < 1:
        raise ValueError(f"--max-model-len must be >= 1, got {max_model_len}")
    given = num_gpu_blocks is not None
    if num_gpu_blocks is None:
        need = REQUESTS_PER_POOL * (max_model_len or 0)
        num_gpu_blocks = max(BENCH_NUM_GPU_BLOCKS, -(-need // BLOCK_SIZE))
    capacity = num_gpu_blocks * BLOCK_SIZE
    if max_model_len is None:
        limit = min(MODEL_CONTEXT, max(1, capacity // REQUESTS_PER_POOL))
        # The default pool's limit is in --help; a pool the user chose gets it said.
        note = None if limit == MODEL_CONTEXT or not given else (
            f"--max-model-len {limit}: 1/{REQUESTS_PER_POOL} of --num-gpu-blocks "
            f"{num_gpu_blocks} x {BLOCK_SIZE} tokens (longer requests are left out of the "
            f"workload; pass --max-model-len up to {capacity} to keep them)")
        return KVSizes(limit, num_gpu_blocks, note)
    if max_model_len > capacity:
        raise ValueError(
            f"--max-model-len {max_model_len} exceeds the KV pool of --num-gpu-blocks "
            f"{num_gpu_blocks} x {BLOCK_SIZE} = {capacity} tokens: pass --max-model-len "
            f"{capacity} (or less), or --num-gpu-blocks {-(-max_model_len // BLOCK_SIZE)} "
            f"(or more)")
    return KVSizes(max_model_len, num_gpu_blocks)


def reads_predictions(policy: str) -> bool:
    """Whether ``policy`` ranks requests by predicted output length: such policies react to a
    prediction's arrival (``Policy.on_prediction``); the others leave it to the base class."""
    from services.scheduler.policies import POLICIES
    from services.scheduler.policy import Policy
    cls = POLICIES.get(policy)
    return cls is not None and cls.on_prediction is not Policy.on_prediction


def backend_predictor(spec: BackendSpec, predictor: str | None) -> str:
    """The predictor of one backend: ``--predictor`` when given (every policy then pays for the
    same one); else the embedded one for a length-aware ``lenserve:<policy>``, none for others."""
    if predictor is not None:
        return predictor
    # The oracle policy reads the true lengths whatever the predictor (LenserveBackend).
    if spec.kind == "lenserve" and spec.arg != "oracle" and reads_predictions(spec.arg or ""):
        return DEFAULT_LENGTH_PREDICTOR
    return "none"
