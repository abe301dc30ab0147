"""Attention backends by name. Triton and the C++ CPU kernel are loaded only when asked for.

``auto`` picks the fastest backend that works where the model runs: ``triton`` on a CUDA device
when Triton is installed, ``cpu`` (the compiled paged decode kernel) on a CPU when it builds,
else ``torch``.
"""
from __future__ import annotations

import importlib
import importlib.util
import logging
from typing import TYPE_CHECKING

from lenserve_contract.sampling_params import InvalidRequestError

if TYPE_CHECKING:   # torch: imported with the backend itself, not with the names
    from services.executor.attention.base import AttentionBackend

log = logging.getLogger(__name__)

BACKENDS: dict[str, tuple[str, str]] = {
    "torch": ("services.executor.attention.torch_backend", "TorchAttention"),
    "cpu": ("services.executor.attention.cpu_backend", "CpuAttention"),
    "triton": ("services.executor.attention.triton_backend", "TritonAttention"),
}
BACKEND_CHOICES = ["auto", *sorted(BACKENDS)]


def available_backends() -> list[str]:
    return sorted(BACKENDS)


def resolve_backend(name: str, device: str = "cpu") -> str:
    """The concrete backend ``auto`` stands for on ``device``; other names pass through."""
    if name != "auto":
        return name
    if str(device).startswith("cuda"):
        return "triton" if importlib.util.find_spec("triton") is not None else "torch"
    from services.executor.attention import cpu_kernels

    if cpu_kernels.available():
        return "cpu"
    log.warning("attention backend auto: the C++ CPU kernel is unavailable, using torch")
    return "torch"


def check_backend_name(name: str) -> None:
    if name not in BACKEND_CHOICES:
        raise InvalidRequestError(
            f"unknown attention backend {name!r}: choose one of {BACKEND_CHOICES}",
            field="attention_backend")


def get_backend(name: str, device: str = "cpu") -> AttentionBackend:
    check_backend_name(name)
    name = resolve_backend(name, device)
    if name == "triton" and not str(device).startswith("cuda"):
        log.warning("attention backend triton on %s runs in Triton's interpreter: correct, but "
                    "far slower than the cpu or torch backends", device)
    module, cls = BACKENDS[name]
    return getattr(importlib.import_module(module), cls)()
