"""Attention backends by name. Triton is imported only when asked for: it is an optional extra."""
from __future__ import annotations

import importlib

from lenserve.sampling_params import InvalidRequestError
from services.executor.attention.base import AttentionBackend

BACKENDS: dict[str, tuple[str, str]] = {
    "torch": ("services.executor.attention.torch_backend", "TorchAttention"),
    "triton": ("services.executor.attention.triton_backend", "TritonAttention"),
}


def available_backends() -> list[str]:
    return sorted(BACKENDS)


def get_backend(name: str) -> AttentionBackend:
    if name not in BACKENDS:
        raise InvalidRequestError(
            f"unknown attention backend {name!r}: choose one of {available_backends()}",
            field="attention_backend")
    module, cls = BACKENDS[name]
    return getattr(importlib.import_module(module), cls)()
