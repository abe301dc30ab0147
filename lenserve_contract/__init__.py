"""lenserve's contract: the leaf package every layer builds on.

Sampling parameters, request outputs, error types and the generated protobuf code. It imports
nothing else of the project, so ``services/*`` and the user-facing ``lenserve`` package can
both depend on it without importing each other upwards.
"""
from __future__ import annotations

from lenserve_contract.errors import InvalidRequestError
from lenserve_contract.outputs import CompletionOutput, RequestMetrics, RequestOutput
from lenserve_contract.sampling_params import SamplingParams

__all__ = ["CompletionOutput", "InvalidRequestError", "RequestMetrics", "RequestOutput",
           "SamplingParams"]
