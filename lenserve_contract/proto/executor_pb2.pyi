from lenserve_contract.proto import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ScheduledSequence(_message.Message):
    __slots__ = ("request_id", "token_ids", "num_computed_tokens", "block_table", "sample", "sampling_params", "num_output_tokens", "block_table_is_delta", "context_token_ids", "host_block_table", "streamed")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    NUM_COMPUTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    BLOCK_TABLE_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_PARAMS_FIELD_NUMBER: _ClassVar[int]
    NUM_OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    BLOCK_TABLE_IS_DELTA_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    HOST_BLOCK_TABLE_FIELD_NUMBER: _ClassVar[int]
    STREAMED_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    num_computed_tokens: int
    block_table: _containers.RepeatedScalarFieldContainer[int]
    sample: bool
    sampling_params: _common_pb2.SamplingParams
    num_output_tokens: int
    block_table_is_delta: bool
    context_token_ids: _containers.RepeatedScalarFieldContainer[int]
    host_block_table: _containers.RepeatedScalarFieldContainer[int]
    streamed: bool
    def __init__(self, request_id: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., num_computed_tokens: _Optional[int] = ..., block_table: _Optional[_Iterable[int]] = ..., sample: _Optional[bool] = ..., sampling_params: _Optional[_Union[_common_pb2.SamplingParams, _Mapping]] = ..., num_output_tokens: _Optional[int] = ..., block_table_is_delta: _Optional[bool] = ..., context_token_ids: _Optional[_Iterable[int]] = ..., host_block_table: _Optional[_Iterable[int]] = ..., streamed: _Optional[bool] = ...) -> None: ...

class Wave(_message.Message):
    __slots__ = ("sequence_indices",)
    SEQUENCE_INDICES_FIELD_NUMBER: _ClassVar[int]
    sequence_indices: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, sequence_indices: _Optional[_Iterable[int]] = ...) -> None: ...

class BlockMove(_message.Message):
    __slots__ = ("src", "dst")
    SRC_FIELD_NUMBER: _ClassVar[int]
    DST_FIELD_NUMBER: _ClassVar[int]
    src: int
    dst: int
    def __init__(self, src: _Optional[int] = ..., dst: _Optional[int] = ...) -> None: ...

class ExecuteRequest(_message.Message):
    __slots__ = ("iteration", "sequences", "copy_blocks", "swap_in", "swap_out", "swap_shm_name", "finished_request_ids", "waves")
    ITERATION_FIELD_NUMBER: _ClassVar[int]
    SEQUENCES_FIELD_NUMBER: _ClassVar[int]
    COPY_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    SWAP_IN_FIELD_NUMBER: _ClassVar[int]
    SWAP_OUT_FIELD_NUMBER: _ClassVar[int]
    SWAP_SHM_NAME_FIELD_NUMBER: _ClassVar[int]
    FINISHED_REQUEST_IDS_FIELD_NUMBER: _ClassVar[int]
    WAVES_FIELD_NUMBER: _ClassVar[int]
    iteration: int
    sequences: _containers.RepeatedCompositeFieldContainer[ScheduledSequence]
    copy_blocks: _containers.RepeatedCompositeFieldContainer[BlockMove]
    swap_in: _containers.RepeatedCompositeFieldContainer[BlockMove]
    swap_out: _containers.RepeatedCompositeFieldContainer[BlockMove]
    swap_shm_name: str
    finished_request_ids: _containers.RepeatedScalarFieldContainer[str]
    waves: _containers.RepeatedCompositeFieldContainer[Wave]
    def __init__(self, iteration: _Optional[int] = ..., sequences: _Optional[_Iterable[_Union[ScheduledSequence, _Mapping]]] = ..., copy_blocks: _Optional[_Iterable[_Union[BlockMove, _Mapping]]] = ..., swap_in: _Optional[_Iterable[_Union[BlockMove, _Mapping]]] = ..., swap_out: _Optional[_Iterable[_Union[BlockMove, _Mapping]]] = ..., swap_shm_name: _Optional[str] = ..., finished_request_ids: _Optional[_Iterable[str]] = ..., waves: _Optional[_Iterable[_Union[Wave, _Mapping]]] = ...) -> None: ...

class SampledToken(_message.Message):
    __slots__ = ("request_id", "token_id", "logprob", "top_token_ids", "top_logprobs", "has_logprobs")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    TOP_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    TOP_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    HAS_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    token_id: int
    logprob: float
    top_token_ids: _containers.RepeatedScalarFieldContainer[int]
    top_logprobs: _containers.RepeatedScalarFieldContainer[float]
    has_logprobs: bool
    def __init__(self, request_id: _Optional[str] = ..., token_id: _Optional[int] = ..., logprob: _Optional[float] = ..., top_token_ids: _Optional[_Iterable[int]] = ..., top_logprobs: _Optional[_Iterable[float]] = ..., has_logprobs: _Optional[bool] = ...) -> None: ...

class IterationTimings(_message.Message):
    __slots__ = ("forward_s", "attention_s", "sample_s", "total_s", "swap_s", "wave_attention_s")
    FORWARD_S_FIELD_NUMBER: _ClassVar[int]
    ATTENTION_S_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_S_FIELD_NUMBER: _ClassVar[int]
    TOTAL_S_FIELD_NUMBER: _ClassVar[int]
    SWAP_S_FIELD_NUMBER: _ClassVar[int]
    WAVE_ATTENTION_S_FIELD_NUMBER: _ClassVar[int]
    forward_s: float
    attention_s: float
    sample_s: float
    total_s: float
    swap_s: float
    wave_attention_s: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, forward_s: _Optional[float] = ..., attention_s: _Optional[float] = ..., sample_s: _Optional[float] = ..., total_s: _Optional[float] = ..., swap_s: _Optional[float] = ..., wave_attention_s: _Optional[_Iterable[float]] = ...) -> None: ...

class ExecuteResponse(_message.Message):
    __slots__ = ("iteration", "sampled", "timings", "error")
    ITERATION_FIELD_NUMBER: _ClassVar[int]
    SAMPLED_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    iteration: int
    sampled: _containers.RepeatedCompositeFieldContainer[SampledToken]
    timings: IterationTimings
    error: _common_pb2.ErrorDetail
    def __init__(self, iteration: _Optional[int] = ..., sampled: _Optional[_Iterable[_Union[SampledToken, _Mapping]]] = ..., timings: _Optional[_Union[IterationTimings, _Mapping]] = ..., error: _Optional[_Union[_common_pb2.ErrorDetail, _Mapping]] = ...) -> None: ...

class ModelInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ModelInfo(_message.Message):
    __slots__ = ("name", "family", "vocab_size", "num_layers", "num_heads", "num_kv_heads", "head_dim", "max_model_len", "block_size", "num_gpu_blocks", "bytes_per_block", "eos_token_id", "dtype", "attention_backend", "eos_token_ids")
    NAME_FIELD_NUMBER: _ClassVar[int]
    FAMILY_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    NUM_LAYERS_FIELD_NUMBER: _ClassVar[int]
    NUM_HEADS_FIELD_NUMBER: _ClassVar[int]
    NUM_KV_HEADS_FIELD_NUMBER: _ClassVar[int]
    HEAD_DIM_FIELD_NUMBER: _ClassVar[int]
    MAX_MODEL_LEN_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    NUM_GPU_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    BYTES_PER_BLOCK_FIELD_NUMBER: _ClassVar[int]
    EOS_TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    ATTENTION_BACKEND_FIELD_NUMBER: _ClassVar[int]
    EOS_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    name: str
    family: str
    vocab_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_model_len: int
    block_size: int
    num_gpu_blocks: int
    bytes_per_block: int
    eos_token_id: int
    dtype: str
    attention_backend: str
    eos_token_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, name: _Optional[str] = ..., family: _Optional[str] = ..., vocab_size: _Optional[int] = ..., num_layers: _Optional[int] = ..., num_heads: _Optional[int] = ..., num_kv_heads: _Optional[int] = ..., head_dim: _Optional[int] = ..., max_model_len: _Optional[int] = ..., block_size: _Optional[int] = ..., num_gpu_blocks: _Optional[int] = ..., bytes_per_block: _Optional[int] = ..., eos_token_id: _Optional[int] = ..., dtype: _Optional[str] = ..., attention_backend: _Optional[str] = ..., eos_token_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class BlockDataRequest(_message.Message):
    __slots__ = ("block_ids", "shm_name", "int8", "num_tokens")
    BLOCK_IDS_FIELD_NUMBER: _ClassVar[int]
    SHM_NAME_FIELD_NUMBER: _ClassVar[int]
    INT8_FIELD_NUMBER: _ClassVar[int]
    NUM_TOKENS_FIELD_NUMBER: _ClassVar[int]
    block_ids: _containers.RepeatedScalarFieldContainer[int]
    shm_name: str
    int8: bool
    num_tokens: int
    def __init__(self, block_ids: _Optional[_Iterable[int]] = ..., shm_name: _Optional[str] = ..., int8: _Optional[bool] = ..., num_tokens: _Optional[int] = ...) -> None: ...

class BlockDataResponse(_message.Message):
    __slots__ = ("num_bytes", "error")
    NUM_BYTES_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    num_bytes: int
    error: _common_pb2.ErrorDetail
    def __init__(self, num_bytes: _Optional[int] = ..., error: _Optional[_Union[_common_pb2.ErrorDetail, _Mapping]] = ...) -> None: ...

class CompileGrammarResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
