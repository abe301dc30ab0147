"""Factories for simulator tests: a small model shape, a constant or linear cost model and
timed workloads, all without a model or a tokenizer."""
from __future__ import annotations

from lenserve.bench.backends.base import BackendOptions
from lenserve.bench.simulation import SimSpec
from lenserve.workloads.types import BenchRequest, Workload
from services.simulator.cost_model import LinearCostModel
from services.simulator.shapes import ModelShape
from services.simulator.target import SimTarget

SHAPE = ModelShape("tiny-shape", "opt", 2, 64, 4, 4, 16, 256, 257, 256, "float32", 256)


def constant_cost(seconds: float) -> LinearCostModel:
    return LinearCostModel(seconds, (0.0, 0.0, 0.0))


def make_target(cost=None, num_gpu_blocks: int = 64, block_size: int = 4) -> SimTarget:
    return SimTarget(SHAPE, cost or constant_cost(0.01), num_gpu_blocks, block_size, ())


def make_spec(policy: str = "vllm", target: SimTarget | None = None, **options) -> SimSpec:
    opts = BackendOptions(model="fake", max_model_len=options.pop("max_model_len", 128),
                          **options)
    return SimSpec(f"sim:{policy}", policy, target or make_target(), opts)


def workload(*requests: tuple[int, int, float]) -> Workload:
    """``(prompt_len, output_len, arrival)`` each; prompt tokens are printable bytes."""
    reqs = [BenchRequest(f"req-{i}", tuple(65 + (i + j) % 26 for j in range(p)), o, t)
            for i, (p, o, t) in enumerate(requests)]
    return Workload("test", tuple(sorted(reqs, key=lambda r: r.arrival_offset)))
