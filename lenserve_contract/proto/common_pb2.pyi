from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class FinishReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FINISH_REASON_UNSPECIFIED: _ClassVar[FinishReason]
    FINISH_REASON_STOP: _ClassVar[FinishReason]
    FINISH_REASON_LENGTH: _ClassVar[FinishReason]
    FINISH_REASON_ABORT: _ClassVar[FinishReason]
    FINISH_REASON_ERROR: _ClassVar[FinishReason]

class ErrorCode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ERROR_CODE_UNSPECIFIED: _ClassVar[ErrorCode]
    ERROR_CODE_INVALID_ARGUMENT: _ClassVar[ErrorCode]
    ERROR_CODE_PROMPT_TOO_LONG: _ClassVar[ErrorCode]
    ERROR_CODE_UNKNOWN_MODEL: _ClassVar[ErrorCode]
    ERROR_CODE_UNAVAILABLE: _ClassVar[ErrorCode]
    ERROR_CODE_RESOURCE_EXHAUSTED: _ClassVar[ErrorCode]
    ERROR_CODE_INTERNAL: _ClassVar[ErrorCode]

class PredictionSource(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PREDICTION_SOURCE_UNSPECIFIED: _ClassVar[PredictionSource]
    PREDICTION_SOURCE_RETRIEVAL: _ClassVar[PredictionSource]
    PREDICTION_SOURCE_MLP: _ClassVar[PredictionSource]
    PREDICTION_SOURCE_DEFAULT: _ClassVar[PredictionSource]
    PREDICTION_SOURCE_ORACLE: _ClassVar[PredictionSource]
FINISH_REASON_UNSPECIFIED: FinishReason
FINISH_REASON_STOP: FinishReason
FINISH_REASON_LENGTH: FinishReason
FINISH_REASON_ABORT: FinishReason
FINISH_REASON_ERROR: FinishReason
ERROR_CODE_UNSPECIFIED: ErrorCode
ERROR_CODE_INVALID_ARGUMENT: ErrorCode
ERROR_CODE_PROMPT_TOO_LONG: ErrorCode
ERROR_CODE_UNKNOWN_MODEL: ErrorCode
ERROR_CODE_UNAVAILABLE: ErrorCode
ERROR_CODE_RESOURCE_EXHAUSTED: ErrorCode
ERROR_CODE_INTERNAL: ErrorCode
PREDICTION_SOURCE_UNSPECIFIED: PredictionSource
PREDICTION_SOURCE_RETRIEVAL: PredictionSource
PREDICTION_SOURCE_MLP: PredictionSource
PREDICTION_SOURCE_DEFAULT: PredictionSource
PREDICTION_SOURCE_ORACLE: PredictionSource

class SamplingParams(_message.Message):
    __slots__ = ("temperature", "top_k", "top_p", "seed", "max_tokens", "stop", "stop_token_ids", "ignore_eos", "min_tokens", "detokenize", "logprobs", "presence_penalty", "frequency_penalty", "repetition_penalty", "min_p", "logit_bias", "structured_output", "truncate_prompt_tokens", "cap_max_tokens", "n")
    class LogitBiasEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: float
        def __init__(self, key: _Optional[int] = ..., value: _Optional[float] = ...) -> None: ...
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    STOP_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    IGNORE_EOS_FIELD_NUMBER: _ClassVar[int]
    MIN_TOKENS_FIELD_NUMBER: _ClassVar[int]
    DETOKENIZE_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    PRESENCE_PENALTY_FIELD_NUMBER: _ClassVar[int]
    FREQUENCY_PENALTY_FIELD_NUMBER: _ClassVar[int]
    REPETITION_PENALTY_FIELD_NUMBER: _ClassVar[int]
    MIN_P_FIELD_NUMBER: _ClassVar[int]
    LOGIT_BIAS_FIELD_NUMBER: _ClassVar[int]
    STRUCTURED_OUTPUT_FIELD_NUMBER: _ClassVar[int]
    TRUNCATE_PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CAP_MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    N_FIELD_NUMBER: _ClassVar[int]
    temperature: float
    top_k: int
    top_p: float
    seed: int
    max_tokens: int
    stop: _containers.RepeatedScalarFieldContainer[str]
    stop_token_ids: _containers.RepeatedScalarFieldContainer[int]
    ignore_eos: bool
    min_tokens: int
    detokenize: bool
    logprobs: int
    presence_penalty: float
    frequency_penalty: float
    repetition_penalty: float
    min_p: float
    logit_bias: _containers.ScalarMap[int, float]
    structured_output: StructuredOutput
    truncate_prompt_tokens: int
    cap_max_tokens: bool
    n: int
    def __init__(self, temperature: _Optional[float] = ..., top_k: _Optional[int] = ..., top_p: _Optional[float] = ..., seed: _Optional[int] = ..., max_tokens: _Optional[int] = ..., stop: _Optional[_Iterable[str]] = ..., stop_token_ids: _Optional[_Iterable[int]] = ..., ignore_eos: _Optional[bool] = ..., min_tokens: _Optional[int] = ..., detokenize: _Optional[bool] = ..., logprobs: _Optional[int] = ..., presence_penalty: _Optional[float] = ..., frequency_penalty: _Optional[float] = ..., repetition_penalty: _Optional[float] = ..., min_p: _Optional[float] = ..., logit_bias: _Optional[_Mapping[int, float]] = ..., structured_output: _Optional[_Union[StructuredOutput, _Mapping]] = ..., truncate_prompt_tokens: _Optional[int] = ..., cap_max_tokens: _Optional[bool] = ..., n: _Optional[int] = ...) -> None: ...

class StructuredOutput(_message.Message):
    __slots__ = ("kind", "schema")
    KIND_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_FIELD_NUMBER: _ClassVar[int]
    kind: str
    schema: str
    def __init__(self, kind: _Optional[str] = ..., schema: _Optional[str] = ...) -> None: ...

class TokenLogprob(_message.Message):
    __slots__ = ("token_id", "logprob", "top_token_ids", "top_logprobs")
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    TOP_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    TOP_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    token_id: int
    logprob: float
    top_token_ids: _containers.RepeatedScalarFieldContainer[int]
    top_logprobs: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, token_id: _Optional[int] = ..., logprob: _Optional[float] = ..., top_token_ids: _Optional[_Iterable[int]] = ..., top_logprobs: _Optional[_Iterable[float]] = ...) -> None: ...

class ErrorDetail(_message.Message):
    __slots__ = ("code", "message", "field")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    FIELD_FIELD_NUMBER: _ClassVar[int]
    code: ErrorCode
    message: str
    field: str
    def __init__(self, code: _Optional[_Union[ErrorCode, str]] = ..., message: _Optional[str] = ..., field: _Optional[str] = ...) -> None: ...

class Request(_message.Message):
    __slots__ = ("request_id", "model", "prompt", "prompt_token_ids", "sampling_params", "arrival_time", "slo_deadline_s", "priority", "predicted_output_len")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_PARAMS_FIELD_NUMBER: _ClassVar[int]
    ARRIVAL_TIME_FIELD_NUMBER: _ClassVar[int]
    SLO_DEADLINE_S_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    PREDICTED_OUTPUT_LEN_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    model: str
    prompt: str
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    sampling_params: SamplingParams
    arrival_time: float
    slo_deadline_s: float
    priority: int
    predicted_output_len: int
    def __init__(self, request_id: _Optional[str] = ..., model: _Optional[str] = ..., prompt: _Optional[str] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ..., sampling_params: _Optional[_Union[SamplingParams, _Mapping]] = ..., arrival_time: _Optional[float] = ..., slo_deadline_s: _Optional[float] = ..., priority: _Optional[int] = ..., predicted_output_len: _Optional[int] = ...) -> None: ...

class TokenChunk(_message.Message):
    __slots__ = ("request_id", "token_ids", "text", "finished", "finish_reason", "num_prompt_tokens", "num_output_tokens", "error", "prompt_token_ids", "stop_string", "stop_token_id", "prediction_source", "predicted_output_len", "logprobs", "index")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    NUM_PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    NUM_OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    STOP_STRING_FIELD_NUMBER: _ClassVar[int]
    STOP_TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    PREDICTION_SOURCE_FIELD_NUMBER: _ClassVar[int]
    PREDICTED_OUTPUT_LEN_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    text: str
    finished: bool
    finish_reason: FinishReason
    num_prompt_tokens: int
    num_output_tokens: int
    error: ErrorDetail
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    stop_string: str
    stop_token_id: int
    prediction_source: PredictionSource
    predicted_output_len: int
    logprobs: _containers.RepeatedCompositeFieldContainer[TokenLogprob]
    index: int
    def __init__(self, request_id: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., text: _Optional[str] = ..., finished: _Optional[bool] = ..., finish_reason: _Optional[_Union[FinishReason, str]] = ..., num_prompt_tokens: _Optional[int] = ..., num_output_tokens: _Optional[int] = ..., error: _Optional[_Union[ErrorDetail, _Mapping]] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ..., stop_string: _Optional[str] = ..., stop_token_id: _Optional[int] = ..., prediction_source: _Optional[_Union[PredictionSource, str]] = ..., predicted_output_len: _Optional[int] = ..., logprobs: _Optional[_Iterable[_Union[TokenLogprob, _Mapping]]] = ..., index: _Optional[int] = ...) -> None: ...

class Prediction(_message.Message):
    __slots__ = ("length", "source", "top_similarity", "upper_quantile", "error")
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    TOP_SIMILARITY_FIELD_NUMBER: _ClassVar[int]
    UPPER_QUANTILE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    length: int
    source: PredictionSource
    top_similarity: float
    upper_quantile: int
    error: ErrorDetail
    def __init__(self, length: _Optional[int] = ..., source: _Optional[_Union[PredictionSource, str]] = ..., top_similarity: _Optional[float] = ..., upper_quantile: _Optional[int] = ..., error: _Optional[_Union[ErrorDetail, _Mapping]] = ...) -> None: ...

class CompletionRecord(_message.Message):
    __slots__ = ("request_id", "model", "prompt", "num_prompt_tokens", "num_output_tokens", "finish_reason", "predicted_length", "finished_at")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    NUM_PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    NUM_OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    PREDICTED_LENGTH_FIELD_NUMBER: _ClassVar[int]
    FINISHED_AT_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    model: str
    prompt: str
    num_prompt_tokens: int
    num_output_tokens: int
    finish_reason: FinishReason
    predicted_length: int
    finished_at: float
    def __init__(self, request_id: _Optional[str] = ..., model: _Optional[str] = ..., prompt: _Optional[str] = ..., num_prompt_tokens: _Optional[int] = ..., num_output_tokens: _Optional[int] = ..., finish_reason: _Optional[_Union[FinishReason, str]] = ..., predicted_length: _Optional[int] = ..., finished_at: _Optional[float] = ...) -> None: ...
