"""Re-export of the contract's sampling parameters (``from lenserve.sampling_params import ...``
keeps working for users)."""
from lenserve_contract.errors import InvalidRequestError
from lenserve_contract.sampling_params import SamplingParams

__all__ = ["InvalidRequestError", "SamplingParams"]
