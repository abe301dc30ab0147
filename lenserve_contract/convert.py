"""Contract types to and from their protobuf messages (used by every gRPC transport)."""
from __future__ import annotations

from lenserve_contract.outputs import Logprob
from lenserve_contract.proto import common_pb2
from lenserve_contract.sampling_params import SamplingParams, StructuredOutput

_OPTIONAL = ("temperature", "top_k", "top_p", "seed", "max_tokens", "min_tokens", "detokenize",
             "logprobs", "repetition_penalty", "truncate_prompt_tokens")
_PLAIN = ("presence_penalty", "frequency_penalty", "min_p")


def sampling_params_to_proto(params: SamplingParams) -> common_pb2.SamplingParams:
    msg = common_pb2.SamplingParams(stop=list(params.stop),
                                    stop_token_ids=list(params.stop_token_ids),
                                    ignore_eos=params.ignore_eos,
                                    cap_max_tokens=params.cap_max_tokens)
    for name in _OPTIONAL:
        value = getattr(params, name)
        if value is not None:
            setattr(msg, name, value)
    if params.n != 1:
        msg.n = params.n
    if not params.plain:
        for name in _PLAIN:
            setattr(msg, name, getattr(params, name))
        msg.logit_bias.update(params.logit_bias)
        if params.structured_output is not None:
            so = params.structured_output
            msg.structured_output.CopyFrom(common_pb2.StructuredOutput(kind=so.kind,
                                                                       schema=so.schema))
    return msg


def sampling_params_from_proto(msg: common_pb2.SamplingParams) -> SamplingParams:
    """Unset optional fields take SamplingParams' defaults; bad values raise
    InvalidRequestError (from ``SamplingParams.verify``)."""
    kwargs = {name: getattr(msg, name) for name in _OPTIONAL if msg.HasField(name)}
    kwargs.update({name: getattr(msg, name) for name in _PLAIN})
    if msg.HasField("n"):
        kwargs["n"] = msg.n
    if msg.logit_bias:
        kwargs["logit_bias"] = dict(msg.logit_bias)
    if msg.HasField("structured_output"):
        kwargs["structured_output"] = StructuredOutput(msg.structured_output.kind,
                                                       msg.structured_output.schema)
    return SamplingParams(stop=list(msg.stop), stop_token_ids=list(msg.stop_token_ids),
                          ignore_eos=msg.ignore_eos, cap_max_tokens=msg.cap_max_tokens,
                          **kwargs)


def logprob_to_proto(entry: Logprob) -> common_pb2.TokenLogprob:
    return common_pb2.TokenLogprob(token_id=entry.token_id, logprob=entry.logprob,
                                   top_token_ids=[t for t, _ in entry.top],
                                   top_logprobs=[lp for _, lp in entry.top])


def logprob_from_proto(msg: common_pb2.TokenLogprob) -> Logprob:
    return Logprob(msg.token_id, msg.logprob, list(zip(msg.top_token_ids, msg.top_logprobs)))
