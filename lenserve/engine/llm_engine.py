"""``LLMEngine``: the serving core assembled from an ``EngineConfig`` (vLLM's name for it).

    engine = LLMEngine(EngineConfig(model="opt-125m", policy="vllm", predictor="embedded"))
    engine.add_request("r1", prompt="Hello", sampling_params=SamplingParams(max_tokens=8))
    while engine.has_unfinished_requests():
        outputs = engine.step()
"""
from __future__ import annotations

import time
from collections.abc import Callable

from services.executor.interface import Executor
from services.scheduler.engine_core import EngineCore
from services.scheduler.wiring import FAKE_MODEL, EngineConfig, engine_parts

__all__ = ["FAKE_MODEL", "EngineConfig", "LLMEngine"]


class LLMEngine(EngineCore):
    def __init__(self, config: EngineConfig, executor: Executor | None = None, tokenizer=None,
                 clock: Callable[[], float] = time.monotonic, predictor_progress=None):
        super().__init__(**engine_parts(config, executor, predictor_progress),
                         tokenizer=tokenizer, clock=clock)
        self.config = config
