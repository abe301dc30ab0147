"""The Executor interface. The in-process executor and the gRPC client both implement it."""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

from services.executor.types import ExecutorInput, ExecutorOutput, ModelInfo

if TYPE_CHECKING:   # annotations only: a scheduler or simulator needs no torch
    import torch


class ExecutorUnavailableError(RuntimeError):
    """The executor could not run an iteration for a known outside reason (its process is
    down or restarting); the message says which, a traceback would add nothing."""


class Executor(ABC):
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

    def close(self) -> None:
        """Release resources (sockets, device memory)."""


class StreamError(RuntimeError):
    """A streamed wave (KV read from the host tier, FluidInfer) could not run: a copy failed,
    or a wave is larger than the staging area. Nothing of the iteration was applied; the
    serving core falls back to resident-only schedules."""
