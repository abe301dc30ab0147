"""``create_app(backend, config)``: the FastAPI app, wrapped in the guard (keys, body size)."""
from __future__ import annotations

from fastapi import FastAPI

from gateway.admission import AdmissionGate
from gateway.backend import SchedulerBackend
from gateway.chat import ChatFormatter
from gateway.config import GatewayConfig
from gateway.errors import install_handlers
from gateway.guard import Guard
from gateway.logprobs import TokenNames
from gateway.metrics import GatewayMetrics
from gateway.openapi import finish_schema
from gateway.routes import router


def create_app(backend: SchedulerBackend, config: GatewayConfig, *, tokenizer=None) -> FastAPI:
    """``tokenizer``: the served model's, for its chat template (None: the plain fallback)."""
    app = FastAPI(title="lenserve", description="OpenAI-compatible API of lenserve",
                  version="0.1.0")
    app.state.backend = backend
    app.state.config = config
    app.state.metrics = GatewayMetrics()
    app.state.admission = AdmissionGate(backend, config.max_waiting, config.stats_interval_s)
    app.state.chat = ChatFormatter(tokenizer)
    app.state.token_names = TokenNames(tokenizer)
    install_handlers(app)
    app.include_router(router)
    finish_schema(app, config)
    app.add_middleware(Guard, api_keys=config.api_keys, max_body_bytes=config.max_body_bytes,
                       max_concurrency=config.max_concurrency,
                       retry_after_s=config.retry_after_s)
    return app
