"""Re-export of the contract's request outputs."""
from lenserve_contract.outputs import CompletionOutput, RequestMetrics, RequestOutput

__all__ = ["CompletionOutput", "RequestMetrics", "RequestOutput"]
