"""Factories for engine tests: an engine on the deterministic fake executor and a fake clock."""
from __future__ import annotations

import itertools

from services.executor.fake import FakeExecutor
from lenserve.engine.llm_engine import EngineConfig, LLMEngine


class TickClock:
    """Advances one unit per read, so every engine timestamp is distinct and ordered."""

    def __init__(self):
        self._ticks = itertools.count()

    def __call__(self) -> float:
        return float(next(self._ticks))


def make_engine(policy: str = "vllm", num_gpu_blocks: int = 64, block_size: int = 4,
                max_model_len: int = 128, eos_period: int = 0, executor=None, transport=None,
                **config) -> LLMEngine:
    """``transport``: wraps the executor (``tests.executor.remote.Transports``: in-process or
    a gRPC client of it)."""
    executor = executor or FakeExecutor(num_gpu_blocks=num_gpu_blocks, block_size=block_size,
                                        max_model_len=max_model_len, eos_period=eos_period)
    if transport is not None:
        executor = transport(executor)
    cfg = EngineConfig(model="fake", policy=policy, check_integrity=True,
                       max_model_len=max_model_len, **config)
    return LLMEngine(cfg, executor=executor, clock=TickClock())


def run_to_completion(engine: LLMEngine) -> dict:
    finished = {}
    for _ in range(10_000):
        if not engine.has_unfinished_requests():
            return finished
        for out in engine.step():
            if out.finished:
                finished[out.request_id] = out
    raise AssertionError("engine did not drain")


def replay(engine: LLMEngine, workload) -> dict[str, list[int]]:
    """Add ``(request id, prompt ids, params, predicted length)`` requests one by one, stepping
    after every second, then run to the end: requests arrive while others run. Token ids per
    request."""
    done = {}
    for step, (rid, prompt, params, n) in enumerate(workload):
        engine.add_request(rid, prompt_token_ids=prompt, sampling_params=params,
                           predicted_output_len=n)
        if step % 2 == 0:
            done.update((o.request_id, o) for o in engine.step() if o.finished)
    done.update(run_to_completion(engine))
    return {rid: out.outputs[0].token_ids for rid, out in done.items()}


class CountingExecutor:
    """Counts the tokens the executor is fed."""

    def __init__(self, inner):
        self.inner, self.fed = inner, 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def execute(self, batch):
        self.fed += sum(len(s.token_ids) for s in batch.sequences)
        return self.inner.execute(batch)
