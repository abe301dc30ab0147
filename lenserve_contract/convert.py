"""Contract types to and from their protobuf messages (used by every gRPC transport)."""
from __future__ import annotations

from lenserve_contract.proto import common_pb2
from lenserve_contract.sampling_params import SamplingParams

_OPTIONAL = ("temperature", "top_k", "top_p", "seed", "max_tokens", "min_tokens", "detokenize")


def sampling_params_to_proto(params: SamplingParams) -> common_pb2.SamplingParams:
    msg = common_pb2.SamplingParams(stop=list(params.stop),
                                    stop_token_ids=list(params.stop_token_ids),
                                    ignore_eos=params.ignore_eos)
    for name in _OPTIONAL:
        value = getattr(params, name)
        if value is not None:
            setattr(msg, name, value)
    return msg


def sampling_params_from_proto(msg: common_pb2.SamplingParams) -> SamplingParams:
    """Unset optional fields take SamplingParams' defaults; bad values raise
    InvalidRequestError (from ``SamplingParams.verify``)."""
    kwargs = {name: getattr(msg, name) for name in _OPTIONAL if msg.HasField(name)}
    return SamplingParams(stop=list(msg.stop), stop_token_ids=list(msg.stop_token_ids),
                          ignore_eos=msg.ignore_eos, **kwargs)
