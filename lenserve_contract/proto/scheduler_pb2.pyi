from lenserve_contract.proto import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class AbortRequest(_message.Message):
    __slots__ = ("request_id",)
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    def __init__(self, request_id: _Optional[str] = ...) -> None: ...

class AbortResponse(_message.Message):
    __slots__ = ("found",)
    FOUND_FIELD_NUMBER: _ClassVar[int]
    found: bool
    def __init__(self, found: _Optional[bool] = ...) -> None: ...

class StatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SchedulerStats(_message.Message):
    __slots__ = ("policy", "num_waiting", "num_running", "num_preempted", "num_free_blocks", "num_total_blocks", "num_iterations", "num_finished", "num_preemptions", "num_swapped", "num_free_host_blocks", "num_host_blocks", "num_predictions", "num_completions_reported", "num_completions_dropped", "num_kafka_published", "num_kafka_buffered", "num_kafka_dropped", "prefix_cache_queries", "prefix_cache_hits", "num_cached_blocks", "num_upload_waits", "num_uploads_ahead", "prefix_cache_host_hits", "num_host_cached_blocks")
    POLICY_FIELD_NUMBER: _ClassVar[int]
    NUM_WAITING_FIELD_NUMBER: _ClassVar[int]
    NUM_RUNNING_FIELD_NUMBER: _ClassVar[int]
    NUM_PREEMPTED_FIELD_NUMBER: _ClassVar[int]
    NUM_FREE_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    NUM_TOTAL_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    NUM_ITERATIONS_FIELD_NUMBER: _ClassVar[int]
    NUM_FINISHED_FIELD_NUMBER: _ClassVar[int]
    NUM_PREEMPTIONS_FIELD_NUMBER: _ClassVar[int]
    NUM_SWAPPED_FIELD_NUMBER: _ClassVar[int]
    NUM_FREE_HOST_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    NUM_HOST_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    NUM_PREDICTIONS_FIELD_NUMBER: _ClassVar[int]
    NUM_COMPLETIONS_REPORTED_FIELD_NUMBER: _ClassVar[int]
    NUM_COMPLETIONS_DROPPED_FIELD_NUMBER: _ClassVar[int]
    NUM_KAFKA_PUBLISHED_FIELD_NUMBER: _ClassVar[int]
    NUM_KAFKA_BUFFERED_FIELD_NUMBER: _ClassVar[int]
    NUM_KAFKA_DROPPED_FIELD_NUMBER: _ClassVar[int]
    PREFIX_CACHE_QUERIES_FIELD_NUMBER: _ClassVar[int]
    PREFIX_CACHE_HITS_FIELD_NUMBER: _ClassVar[int]
    NUM_CACHED_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    NUM_UPLOAD_WAITS_FIELD_NUMBER: _ClassVar[int]
    NUM_UPLOADS_AHEAD_FIELD_NUMBER: _ClassVar[int]
    PREFIX_CACHE_HOST_HITS_FIELD_NUMBER: _ClassVar[int]
    NUM_HOST_CACHED_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    policy: str
    num_waiting: int
    num_running: int
    num_preempted: int
    num_free_blocks: int
    num_total_blocks: int
    num_iterations: int
    num_finished: int
    num_preemptions: int
    num_swapped: int
    num_free_host_blocks: int
    num_host_blocks: int
    num_predictions: int
    num_completions_reported: int
    num_completions_dropped: int
    num_kafka_published: int
    num_kafka_buffered: int
    num_kafka_dropped: int
    prefix_cache_queries: int
    prefix_cache_hits: int
    num_cached_blocks: int
    num_upload_waits: int
    num_uploads_ahead: int
    prefix_cache_host_hits: int
    num_host_cached_blocks: int
    def __init__(self, policy: _Optional[str] = ..., num_waiting: _Optional[int] = ..., num_running: _Optional[int] = ..., num_preempted: _Optional[int] = ..., num_free_blocks: _Optional[int] = ..., num_total_blocks: _Optional[int] = ..., num_iterations: _Optional[int] = ..., num_finished: _Optional[int] = ..., num_preemptions: _Optional[int] = ..., num_swapped: _Optional[int] = ..., num_free_host_blocks: _Optional[int] = ..., num_host_blocks: _Optional[int] = ..., num_predictions: _Optional[int] = ..., num_completions_reported: _Optional[int] = ..., num_completions_dropped: _Optional[int] = ..., num_kafka_published: _Optional[int] = ..., num_kafka_buffered: _Optional[int] = ..., num_kafka_dropped: _Optional[int] = ..., prefix_cache_queries: _Optional[int] = ..., prefix_cache_hits: _Optional[int] = ..., num_cached_blocks: _Optional[int] = ..., num_upload_waits: _Optional[int] = ..., num_uploads_ahead: _Optional[int] = ..., prefix_cache_host_hits: _Optional[int] = ..., num_host_cached_blocks: _Optional[int] = ...) -> None: ...

class SubscribeRequest(_message.Message):
    __slots__ = ("subscriber_id",)
    SUBSCRIBER_ID_FIELD_NUMBER: _ClassVar[int]
    subscriber_id: str
    def __init__(self, subscriber_id: _Optional[str] = ...) -> None: ...

class StepChunks(_message.Message):
    __slots__ = ("chunks",)
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    chunks: _containers.RepeatedCompositeFieldContainer[_common_pb2.TokenChunk]
    def __init__(self, chunks: _Optional[_Iterable[_Union[_common_pb2.TokenChunk, _Mapping]]] = ...) -> None: ...

class SubmitRequest(_message.Message):
    __slots__ = ("subscriber_id", "request")
    SUBSCRIBER_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    subscriber_id: str
    request: _common_pb2.Request
    def __init__(self, subscriber_id: _Optional[str] = ..., request: _Optional[_Union[_common_pb2.Request, _Mapping]] = ...) -> None: ...

class SubmitResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class LinkRequest(_message.Message):
    __slots__ = ("submit", "abort")
    SUBMIT_FIELD_NUMBER: _ClassVar[int]
    ABORT_FIELD_NUMBER: _ClassVar[int]
    submit: _common_pb2.Request
    abort: str
    def __init__(self, submit: _Optional[_Union[_common_pb2.Request, _Mapping]] = ..., abort: _Optional[str] = ...) -> None: ...

class Admission(_message.Message):
    __slots__ = ("request_id", "error")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    error: _common_pb2.ErrorDetail
    def __init__(self, request_id: _Optional[str] = ..., error: _Optional[_Union[_common_pb2.ErrorDetail, _Mapping]] = ...) -> None: ...

class LinkReply(_message.Message):
    __slots__ = ("chunks", "admissions")
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    ADMISSIONS_FIELD_NUMBER: _ClassVar[int]
    chunks: _containers.RepeatedCompositeFieldContainer[_common_pb2.TokenChunk]
    admissions: _containers.RepeatedCompositeFieldContainer[Admission]
    def __init__(self, chunks: _Optional[_Iterable[_Union[_common_pb2.TokenChunk, _Mapping]]] = ..., admissions: _Optional[_Iterable[_Union[Admission, _Mapping]]] = ...) -> None: ...

class LoadRequest(_message.Message):
    __slots__ = ("interval_s",)
    INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    interval_s: float
    def __init__(self, interval_s: _Optional[float] = ...) -> None: ...

class ReplicaLoad(_message.Message):
    __slots__ = ("stats", "block_size", "queued_prefill_tokens", "remaining_decode_tokens", "num_unpredicted", "rates_fitted", "t0_s", "alpha_s", "beta_s", "draining", "preempts_by_length")
    STATS_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    QUEUED_PREFILL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    REMAINING_DECODE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    NUM_UNPREDICTED_FIELD_NUMBER: _ClassVar[int]
    RATES_FITTED_FIELD_NUMBER: _ClassVar[int]
    T0_S_FIELD_NUMBER: _ClassVar[int]
    ALPHA_S_FIELD_NUMBER: _ClassVar[int]
    BETA_S_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    PREEMPTS_BY_LENGTH_FIELD_NUMBER: _ClassVar[int]
    stats: SchedulerStats
    block_size: int
    queued_prefill_tokens: int
    remaining_decode_tokens: int
    num_unpredicted: int
    rates_fitted: bool
    t0_s: float
    alpha_s: float
    beta_s: float
    draining: bool
    preempts_by_length: bool
    def __init__(self, stats: _Optional[_Union[SchedulerStats, _Mapping]] = ..., block_size: _Optional[int] = ..., queued_prefill_tokens: _Optional[int] = ..., remaining_decode_tokens: _Optional[int] = ..., num_unpredicted: _Optional[int] = ..., rates_fitted: _Optional[bool] = ..., t0_s: _Optional[float] = ..., alpha_s: _Optional[float] = ..., beta_s: _Optional[float] = ..., draining: _Optional[bool] = ..., preempts_by_length: _Optional[bool] = ...) -> None: ...
