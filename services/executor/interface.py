"""The Executor interface. The in-process executor and the gRPC client both implement it."""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

from lenserve_contract.sampling_params import StructuredOutput
from services.executor.types import ExecutorInput, ExecutorOutput, ModelInfo

if TYPE_CHECKING:   # annotations only: a scheduler or simulator needs no torch
    import torch


class ExecutorUnavailableError(RuntimeError):
    """The executor could not run an iteration for a known outside reason (its process is
    down or restarting); the message says which, a traceback would add nothing."""


class Executor(ABC):
    # True when ``compile_grammar`` compiles (the serving core then holds a request with
    # structured output until its grammar is ready, instead of compiling inside an iteration).
    compiles_grammars = False

    @abstractmethod
    def model_info(self) -> ModelInfo:
        """Shapes the scheduler needs: block size, number of device blocks, context length."""

    @abstractmethod
    def execute(self, batch: ExecutorInput) -> ExecutorOutput:
        """Run one iteration: apply block copies, write the fed tokens' KV into their blocks,
        run the model over the ragged batch and sample one token for each sequence with
        ``sample=True``. Must not keep per-request state between calls."""

    @abstractmethod
    def export_blocks(self, block_ids: list[int], out: torch.Tensor | None = None
                      ) -> torch.Tensor:
        """Copy device blocks to one contiguous host tensor
        ``[num_layers, 2, len(block_ids), block_size, num_kv_heads, head_dim]``. With ``out``
        (a host tensor of that shape and the pool's dtype, possibly strided), write into it
        and return it instead of allocating."""

    @abstractmethod
    def import_blocks(self, block_ids: list[int], data: torch.Tensor) -> None:
        """Write host data laid out as by ``export_blocks`` into the given device blocks."""

    def export_blocks_int8(self, block_ids: list[int], num_tokens: int | None = None,
                           out: torch.Tensor | None = None) -> torch.Tensor:
        """One request's device blocks, in order, quantized to channel-wise INT8 before they
        leave the device, packed as ``services.kvmanager.int8.packed_views`` lays out (into
        ``out``, a flat uint8 host buffer, when given). ``num_tokens``: KV tokens the blocks
        hold (the rest of the last block is stale). This default quantizes on the host after a
        full-precision export: an executor that can, quantizes where its KV lives."""
        import torch

        from services.kvmanager import int8
        q = int8.quantize(self.export_blocks(block_ids), num_tokens)
        buf = out if out is not None else torch.empty(self._packed_nbytes(len(block_ids)),
                                                      dtype=torch.uint8)
        for dst, src in zip(self._packed(buf, len(block_ids)), q):
            dst.copy_(src)
        return buf

    def import_blocks_int8(self, block_ids: list[int], data: torch.Tensor) -> None:
        """Dequantize packed INT8 blocks (``export_blocks_int8``'s form) into device blocks."""
        from services.kvmanager import int8
        views = self._packed(data, len(block_ids))
        self.import_blocks(block_ids, int8.dequantize(views, _dtype(self.model_info())))

    def _packed_nbytes(self, num_blocks: int) -> int:
        from services.kvmanager import int8
        info = self.model_info()
        return int8.packed_nbytes(info.num_layers, num_blocks, info.block_size,
                                  info.num_kv_heads * info.head_dim)

    def _packed(self, buf: torch.Tensor, num_blocks: int):
        from services.kvmanager import int8
        info = self.model_info()
        return int8.packed_views(buf, info.num_layers, num_blocks, info.block_size,
                                 info.num_kv_heads, info.head_dim, _dtype(info))

    def compile_grammar(self, structured_output: StructuredOutput) -> None:
        """Compile a request's grammar into this executor's cache ahead of the request's first
        iteration. Called on a worker thread, beside iterations; may block for the compile.
        Raises InvalidRequestError naming the problem when the grammar cannot be compiled."""

    def close(self) -> None:
        """Release resources (sockets, device memory)."""


def _dtype(info: ModelInfo):
    import torch
    return getattr(torch, info.dtype)


class StreamError(RuntimeError):
    """A streamed wave (KV read from the host tier, FluidInfer) could not run: a copy failed,
    or a wave is larger than the staging area. Nothing of the iteration was applied; the
    serving core falls back to resident-only schedules."""
