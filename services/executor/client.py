"""The ``Executor`` interface over gRPC: what the scheduler uses for a remote executor.

Calls fail fast when the executor is down (the engine ends that iteration's requests with
finish_reason "error"). After a failure the next call first waits up to
``reconnect_wait_s`` for the executor to come back, so requests that arrive during a restart
succeed instead of failing in the channel's reconnect backoff. The executor's tables and KV are gone after a
restart: a request that kept running across it fails on its next block-table delta rather
than decoding from lost KV.

``export_blocks``/``import_blocks`` move block bytes through a shared-memory segment of this
process that the executor maps by name (the kvmanager service uses this client as its
mover): the executor must run on this host and see the same ``/dev/shm``."""
from __future__ import annotations

import threading

import grpc
import torch

from lenserve_contract.errors import InvalidRequestError
from lenserve_contract.proto import executor_pb2, executor_pb2_grpc
from services import rpc
from services.executor import convert
from services.executor.interface import Executor, ExecutorUnavailableError
from services.executor.shared_blocks import SharedStaging
from services.executor.types import ExecutorInput, ExecutorOutput, ModelInfo


class ExecutorClient(Executor):
    """``tokenizer_model``: what to load the tokenizer from (default: the executor's model
    name, which is enough for presets and the fake; give the checkpoint path otherwise)."""

    compiles_grammars = True

    def __init__(self, target: str, *, timeout_s: float = 300.0, connect_timeout_s: float = 60.0,
                 reconnect_wait_s: float = 2.0, tokenizer_model: str | None = None):
        self.target = rpc.strip_scheme(target)
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.reconnect_wait_s = reconnect_wait_s
        self._lost = False            # the last call found the executor unreachable
        self._tokenizer_model = tokenizer_model
        self._tokenizer = None
        self._info: ModelInfo | None = None
        self._staging: SharedStaging | None = None
        self._staging_lock = threading.Lock()
        self._channel = grpc.insecure_channel(self.target, options=rpc.CHANNEL_OPTIONS)
        self._stub = executor_pb2_grpc.ExecutorServiceStub(self._channel)

    def model_info(self) -> ModelInfo:
        if self._info is None:
            # Waits for the executor to come up: the scheduler may start first.
            msg = self._call(self._stub.GetModelInfo, executor_pb2.ModelInfoRequest(),
                             self.connect_timeout_s, wait_for_ready=True)
            self._info = convert.model_info_from_proto(msg)
        return self._info

    @property
    def tokenizer(self):
        if self._tokenizer is None:
            from services.executor.factory import load_tokenizer
            self._tokenizer = load_tokenizer(self._tokenizer_model or self.model_info().name)
        return self._tokenizer

    def execute(self, batch: ExecutorInput) -> ExecutorOutput:
        if self._lost:
            self._await_reconnect()
        msg = self._call(self._stub.Execute, convert.input_to_proto(batch), self.timeout_s)
        return convert.output_from_proto(msg)

    def compile_grammar(self, structured_output) -> None:
        from lenserve_contract.proto import common_pb2
        msg = common_pb2.StructuredOutput(kind=structured_output.kind,
                                          schema=structured_output.schema)
        self._call(self._stub.CompileGrammar, msg, self.timeout_s)

    def _await_reconnect(self) -> None:
        try:
            grpc.channel_ready_future(self._channel).result(timeout=self.reconnect_wait_s)
        except grpc.FutureTimeoutError:
            pass   # still down: the call below fails fast and says so

    def _call(self, method, request, timeout_s: float, wait_for_ready: bool = False):
        try:
            response = method(request, timeout=timeout_s, wait_for_ready=wait_for_ready)
        except grpc.RpcError as err:
            self._lost = err.code() == grpc.StatusCode.UNAVAILABLE
            if err.code() == grpc.StatusCode.INVALID_ARGUMENT:
                raise InvalidRequestError(err.details() or "", field=_field(err)) from None
            raise ExecutorUnavailableError(
                f"executor at {self.target}: {err.code().name}: {err.details()}") from None
        self._lost = False
        return response

    def export_blocks(self, block_ids: list[int], out: torch.Tensor | None = None
                      ) -> torch.Tensor:
        segment, view = self._shared().segment(len(block_ids))
        request = executor_pb2.BlockDataRequest(block_ids=block_ids, shm_name=segment.name)
        self._call(self._stub.ExportBlocks, request, self.timeout_s)
        if out is None:
            return view.clone()
        if not _same_memory(out, view):
            out.copy_(view)
        return out

    def import_blocks(self, block_ids: list[int], data: torch.Tensor) -> None:
        segment, view = self._shared().segment(len(block_ids))
        if tuple(data.shape) != tuple(view.shape):
            raise InvalidRequestError(f"imported KV data has shape {tuple(data.shape)}, "
                                      f"expected {tuple(view.shape)}", field="data")
        if not _same_memory(data, view):
            view.copy_(data)
        request = executor_pb2.BlockDataRequest(block_ids=block_ids, shm_name=segment.name)
        self._call(self._stub.ImportBlocks, request, self.timeout_s)

    def export_blocks_int8(self, block_ids: list[int], num_tokens: int | None = None,
                           out: torch.Tensor | None = None) -> torch.Tensor:
        """Quantized by the executor: the shared segment carries the packed INT8 bytes."""
        segment, view = self._shared().byte_segment(self._packed_nbytes(len(block_ids)))
        request = executor_pb2.BlockDataRequest(block_ids=block_ids, shm_name=segment.name,
                                                int8=True, num_tokens=num_tokens or 0)
        self._call(self._stub.ExportBlocks, request, self.timeout_s)
        if out is None:
            return view.clone()
        if not _same_memory(out[:view.numel()], view):
            out[:view.numel()].copy_(view)
        return out

    def import_blocks_int8(self, block_ids: list[int], data: torch.Tensor) -> None:
        segment, view = self._shared().byte_segment(self._packed_nbytes(len(block_ids)))
        if not _same_memory(data[:view.numel()], view):
            view.copy_(data[:view.numel()])
        request = executor_pb2.BlockDataRequest(block_ids=block_ids, shm_name=segment.name,
                                                int8=True)
        self._call(self._stub.ImportBlocks, request, self.timeout_s)

    def staging(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """A host buffer in this thread's shared segment: a KV manager that stages blocks
        here moves them with no copy on this side."""
        return self._shared().view(shape, dtype)

    def _shared(self) -> SharedStaging:
        with self._staging_lock:       # copy threads of a KV manager come here at once
            if self._staging is None:
                self._staging = SharedStaging(self.model_info())
            return self._staging

    def close(self) -> None:
        self._channel.close()
        if self._staging is not None:
            self._staging.close()


def _field(err: grpc.RpcError) -> str:
    for key, value in err.trailing_metadata() or ():
        if key == rpc.FIELD_METADATA_KEY:
            return value
    return ""


def _same_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.data_ptr() == b.data_ptr() and a.shape == b.shape and a.stride() == b.stride()
