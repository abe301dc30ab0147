"""OpenAI-compatible REST front of the scheduler: ``create_app(backend, config)``.

The gateway is stateless: every request becomes one ``backend.generate`` stream, where the
backend is anything with the scheduler's call shape (``SchedulerBackend``): the in-process
``AsyncEngine`` or a gRPC scheduler client.

Names are resolved on first use, so that ``gateway.config`` (the flags every ``lenserve``
command parser includes) imports without the web stack."""
from __future__ import annotations

import importlib

_EXPORTS = {"create_app": "gateway.app", "SchedulerBackend": "gateway.backend",
            "GatewayConfig": "gateway.config"}

__all__ = ["GatewayConfig", "SchedulerBackend", "create_app"]


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'gateway' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
