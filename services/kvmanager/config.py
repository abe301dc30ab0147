"""The KV manager's one frozen config, validated on construction."""
from __future__ import annotations

import math
from dataclasses import dataclass

GIB = 1 << 30


@dataclass(frozen=True)
class KVManagerConfig:
    swap_space_gib: float           # host memory for swapped-out KV blocks (0: no swapping)
    int8: bool = False              # keep host blocks as channel-wise INT8 (ALISE Eq. 8)
    pin_memory: bool | None = None  # None: pin when the device is CUDA (async DMA needs it)
    num_workers: int = 1            # copy threads; one keeps copies in submission order

    def __post_init__(self):
        space = self.swap_space_gib
        if isinstance(space, bool) or not isinstance(space, (int, float)):
            raise ValueError(f"swap_space_gib must be a number of GiB, got {space!r}")
        if not math.isfinite(space) or space < 0:
            raise ValueError(f"swap_space_gib must be a finite number >= 0, got {space}")
        if not isinstance(self.int8, bool):
            raise ValueError(f"int8 must be True or False, got {self.int8!r}")
        if self.pin_memory is not None and not isinstance(self.pin_memory, bool):
            raise ValueError(f"pin_memory must be True, False or None, got {self.pin_memory!r}")
        workers = self.num_workers
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise ValueError(f"num_workers must be an integer >= 1, got {workers!r}")

    @property
    def swap_space_bytes(self) -> int:
        return int(self.swap_space_gib * GIB)

    def pin(self, device_type: str) -> bool:
        """Whether host buffers are pinned for a device of this type."""
        return device_type == "cuda" if self.pin_memory is None else self.pin_memory
