from lenserve_contract.proto import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PredictRequest(_message.Message):
    __slots__ = ("model", "prompts")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    PROMPTS_FIELD_NUMBER: _ClassVar[int]
    model: str
    prompts: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, model: _Optional[str] = ..., prompts: _Optional[_Iterable[str]] = ...) -> None: ...

class PredictResponse(_message.Message):
    __slots__ = ("predictions",)
    PREDICTIONS_FIELD_NUMBER: _ClassVar[int]
    predictions: _containers.RepeatedCompositeFieldContainer[_common_pb2.Prediction]
    def __init__(self, predictions: _Optional[_Iterable[_Union[_common_pb2.Prediction, _Mapping]]] = ...) -> None: ...

class ObserveRequest(_message.Message):
    __slots__ = ("records",)
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    records: _containers.RepeatedCompositeFieldContainer[_common_pb2.CompletionRecord]
    def __init__(self, records: _Optional[_Iterable[_Union[_common_pb2.CompletionRecord, _Mapping]]] = ...) -> None: ...

class ObserveResponse(_message.Message):
    __slots__ = ("accepted", "rejected", "errors")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    REJECTED_FIELD_NUMBER: _ClassVar[int]
    ERRORS_FIELD_NUMBER: _ClassVar[int]
    accepted: int
    rejected: int
    errors: _containers.RepeatedCompositeFieldContainer[_common_pb2.ErrorDetail]
    def __init__(self, accepted: _Optional[int] = ..., rejected: _Optional[int] = ..., errors: _Optional[_Iterable[_Union[_common_pb2.ErrorDetail, _Mapping]]] = ...) -> None: ...
