from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DescribeRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class KVLayout(_message.Message):
    __slots__ = ("num_host_blocks", "host_block_bytes", "int8", "copies_overlap")
    NUM_HOST_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    HOST_BLOCK_BYTES_FIELD_NUMBER: _ClassVar[int]
    INT8_FIELD_NUMBER: _ClassVar[int]
    COPIES_OVERLAP_FIELD_NUMBER: _ClassVar[int]
    num_host_blocks: int
    host_block_bytes: int
    int8: bool
    copies_overlap: bool
    def __init__(self, num_host_blocks: _Optional[int] = ..., host_block_bytes: _Optional[int] = ..., int8: _Optional[bool] = ..., copies_overlap: _Optional[bool] = ...) -> None: ...

class SwapOutRequest(_message.Message):
    __slots__ = ("request_id", "device_blocks", "num_tokens")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    DEVICE_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    NUM_TOKENS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    device_blocks: _containers.RepeatedScalarFieldContainer[int]
    num_tokens: int
    def __init__(self, request_id: _Optional[str] = ..., device_blocks: _Optional[_Iterable[int]] = ..., num_tokens: _Optional[int] = ...) -> None: ...

class SwapInRequest(_message.Message):
    __slots__ = ("request_id", "device_blocks")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    DEVICE_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    device_blocks: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, request_id: _Optional[str] = ..., device_blocks: _Optional[_Iterable[int]] = ...) -> None: ...

class SwapTicket(_message.Message):
    __slots__ = ("swap_id",)
    SWAP_ID_FIELD_NUMBER: _ClassVar[int]
    swap_id: int
    def __init__(self, swap_id: _Optional[int] = ...) -> None: ...

class SwapResult(_message.Message):
    __slots__ = ("swap_id", "done", "error")
    SWAP_ID_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    swap_id: int
    done: bool
    error: str
    def __init__(self, swap_id: _Optional[int] = ..., done: _Optional[bool] = ..., error: _Optional[str] = ...) -> None: ...

class WaitAllRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WaitAllResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[SwapResult]
    def __init__(self, results: _Optional[_Iterable[_Union[SwapResult, _Mapping]]] = ...) -> None: ...

class RequestRef(_message.Message):
    __slots__ = ("request_id",)
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    def __init__(self, request_id: _Optional[str] = ...) -> None: ...

class HoldsResponse(_message.Message):
    __slots__ = ("holds",)
    HOLDS_FIELD_NUMBER: _ClassVar[int]
    holds: bool
    def __init__(self, holds: _Optional[bool] = ...) -> None: ...

class FreeResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ResetRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ResetResponse(_message.Message):
    __slots__ = ("num_freed",)
    NUM_FREED_FIELD_NUMBER: _ClassVar[int]
    num_freed: int
    def __init__(self, num_freed: _Optional[int] = ...) -> None: ...

class KVStatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class KVStats(_message.Message):
    __slots__ = ("num_host_blocks", "num_free_host_blocks", "host_bytes_used", "int8", "num_swapped_requests", "bytes_swapped_out", "bytes_swapped_in", "link_bytes_out", "link_bytes_in")
    NUM_HOST_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    NUM_FREE_HOST_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    HOST_BYTES_USED_FIELD_NUMBER: _ClassVar[int]
    INT8_FIELD_NUMBER: _ClassVar[int]
    NUM_SWAPPED_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    BYTES_SWAPPED_OUT_FIELD_NUMBER: _ClassVar[int]
    BYTES_SWAPPED_IN_FIELD_NUMBER: _ClassVar[int]
    LINK_BYTES_OUT_FIELD_NUMBER: _ClassVar[int]
    LINK_BYTES_IN_FIELD_NUMBER: _ClassVar[int]
    num_host_blocks: int
    num_free_host_blocks: int
    host_bytes_used: int
    int8: bool
    num_swapped_requests: int
    bytes_swapped_out: int
    bytes_swapped_in: int
    link_bytes_out: int
    link_bytes_in: int
    def __init__(self, num_host_blocks: _Optional[int] = ..., num_free_host_blocks: _Optional[int] = ..., host_bytes_used: _Optional[int] = ..., int8: _Optional[bool] = ..., num_swapped_requests: _Optional[int] = ..., bytes_swapped_out: _Optional[int] = ..., bytes_swapped_in: _Optional[int] = ..., link_bytes_out: _Optional[int] = ..., link_bytes_in: _Optional[int] = ...) -> None: ...

class IntegrityRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class IntegrityReport(_message.Message):
    __slots__ = ("ok", "problem")
    OK_FIELD_NUMBER: _ClassVar[int]
    PROBLEM_FIELD_NUMBER: _ClassVar[int]
    ok: bool
    problem: str
    def __init__(self, ok: _Optional[bool] = ..., problem: _Optional[str] = ...) -> None: ...
