from lenserve_contract.proto import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class AllocateRequest(_message.Message):
    __slots__ = ("request_id", "num_blocks")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    NUM_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    num_blocks: int
    def __init__(self, request_id: _Optional[str] = ..., num_blocks: _Optional[int] = ...) -> None: ...

class AllocateResponse(_message.Message):
    __slots__ = ("host_blocks", "error")
    HOST_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    host_blocks: _containers.RepeatedScalarFieldContainer[int]
    error: _common_pb2.ErrorDetail
    def __init__(self, host_blocks: _Optional[_Iterable[int]] = ..., error: _Optional[_Union[_common_pb2.ErrorDetail, _Mapping]] = ...) -> None: ...

class FreeRequest(_message.Message):
    __slots__ = ("request_id",)
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    def __init__(self, request_id: _Optional[str] = ...) -> None: ...

class FreeResponse(_message.Message):
    __slots__ = ("num_freed",)
    NUM_FREED_FIELD_NUMBER: _ClassVar[int]
    num_freed: int
    def __init__(self, num_freed: _Optional[int] = ...) -> None: ...

class SwapCandidate(_message.Message):
    __slots__ = ("request_id", "num_blocks", "estimated_wait_s", "on_device")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    NUM_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    ESTIMATED_WAIT_S_FIELD_NUMBER: _ClassVar[int]
    ON_DEVICE_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    num_blocks: int
    estimated_wait_s: float
    on_device: bool
    def __init__(self, request_id: _Optional[str] = ..., num_blocks: _Optional[int] = ..., estimated_wait_s: _Optional[float] = ..., on_device: _Optional[bool] = ...) -> None: ...

class SwapPlanRequest(_message.Message):
    __slots__ = ("candidates", "free_device_blocks", "device_blocks_needed")
    CANDIDATES_FIELD_NUMBER: _ClassVar[int]
    FREE_DEVICE_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    DEVICE_BLOCKS_NEEDED_FIELD_NUMBER: _ClassVar[int]
    candidates: _containers.RepeatedCompositeFieldContainer[SwapCandidate]
    free_device_blocks: int
    device_blocks_needed: int
    def __init__(self, candidates: _Optional[_Iterable[_Union[SwapCandidate, _Mapping]]] = ..., free_device_blocks: _Optional[int] = ..., device_blocks_needed: _Optional[int] = ...) -> None: ...

class SwapPlan(_message.Message):
    __slots__ = ("swap_out", "swap_in")
    SWAP_OUT_FIELD_NUMBER: _ClassVar[int]
    SWAP_IN_FIELD_NUMBER: _ClassVar[int]
    swap_out: _containers.RepeatedScalarFieldContainer[str]
    swap_in: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, swap_out: _Optional[_Iterable[str]] = ..., swap_in: _Optional[_Iterable[str]] = ...) -> None: ...

class SwapRequest(_message.Message):
    __slots__ = ("request_id", "device_blocks", "shm_name")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    DEVICE_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    SHM_NAME_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    device_blocks: _containers.RepeatedScalarFieldContainer[int]
    shm_name: str
    def __init__(self, request_id: _Optional[str] = ..., device_blocks: _Optional[_Iterable[int]] = ..., shm_name: _Optional[str] = ...) -> None: ...

class SwapResponse(_message.Message):
    __slots__ = ("num_bytes", "error")
    NUM_BYTES_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    num_bytes: int
    error: _common_pb2.ErrorDetail
    def __init__(self, num_bytes: _Optional[int] = ..., error: _Optional[_Union[_common_pb2.ErrorDetail, _Mapping]] = ...) -> None: ...

class KVStatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class KVStats(_message.Message):
    __slots__ = ("num_host_blocks", "num_free_host_blocks", "host_bytes_used", "int8")
    NUM_HOST_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    NUM_FREE_HOST_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    HOST_BYTES_USED_FIELD_NUMBER: _ClassVar[int]
    INT8_FIELD_NUMBER: _ClassVar[int]
    num_host_blocks: int
    num_free_host_blocks: int
    host_bytes_used: int
    int8: bool
    def __init__(self, num_host_blocks: _Optional[int] = ..., num_free_host_blocks: _Optional[int] = ..., host_bytes_used: _Optional[int] = ..., int8: _Optional[bool] = ...) -> None: ...
