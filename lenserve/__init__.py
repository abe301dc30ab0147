"""lenserve: LLM serving with length-aware scheduling.

    from lenserve import LLM, SamplingParams
"""
from __future__ import annotations

from lenserve_contract.outputs import CompletionOutput, RequestOutput
from lenserve_contract.sampling_params import InvalidRequestError, SamplingParams

__all__ = [
    "LLM",
    "AsyncEngine",
    "CompletionOutput",
    "InvalidRequestError",
    "RequestOutput",
    "SamplingParams",
]
__version__ = "0.1.0"


def __getattr__(name: str):
    # The engine pulls in torch and the model code; keep ``import lenserve`` light.
    if name == "LLM":
        from lenserve.entrypoints.llm import LLM
        return LLM
    if name == "AsyncEngine":
        from lenserve.engine.async_engine import AsyncEngine
        return AsyncEngine
    raise AttributeError(f"module 'lenserve' has no attribute {name!r}")
