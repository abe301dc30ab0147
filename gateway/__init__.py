"""OpenAI-compatible REST front of the scheduler: ``create_app(backend, config)``.

The gateway is stateless: every request becomes one ``backend.generate`` stream, where the
backend is anything with the scheduler's call shape (``SchedulerBackend``): the in-process
``AsyncEngine`` or a gRPC scheduler client."""
from gateway.app import create_app
from gateway.backend import SchedulerBackend
from gateway.config import GatewayConfig

__all__ = ["GatewayConfig", "SchedulerBackend", "create_app"]
