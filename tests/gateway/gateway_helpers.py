"""A live gateway over an in-process fake-model engine, on a free loopback port."""
from __future__ import annotations

import dataclasses

import openai
from gateway import GatewayConfig, create_app
from gateway.server import ServerThread
from services.scheduler.async_engine import AsyncEngine
from services.scheduler.wiring import EngineConfig

API_KEY = "sk-test-key"


@dataclasses.dataclass
class Live:
    url: str
    engine: AsyncEngine
    app: object
    config: GatewayConfig
    backend: object = None

    def client(self, key: str | None = None, **kwargs) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key=key or "none", max_retries=0,
                             **kwargs)


def start_gateway(engine_kwargs: dict | None = None, wrap=None,
                  **config_kwargs) -> tuple[Live, ServerThread]:
    """``wrap``: builds the backend the app sees around the engine."""
    engine = AsyncEngine(EngineConfig(model="fake", **(engine_kwargs or {})))
    config = GatewayConfig(served_model_name="fake", **config_kwargs)
    backend = wrap(engine) if wrap else engine
    app = create_app(backend, config, tokenizer=engine.engine.tokenizer)
    server = ServerThread(app).start()
    return Live(server.url, engine, app, config, backend), server


class Recording:
    """A backend wrapper that notes the streams closed before their end, and the aborts."""

    def __init__(self, backend):
        self.backend = backend
        self.closed_early: list[str] = []
        self.aborted: list[str] = []

    async def generate(self, *args, request_id=None, **kwargs):
        finished = False
        try:
            async for out in self.backend.generate(*args, request_id=request_id, **kwargs):
                finished = out.finished
                yield out
        finally:
            if not finished:
                self.closed_early.append(request_id)

    async def abort(self, request_id):
        self.aborted.append(request_id)
        return await self.backend.abort(request_id)

    async def stats(self):
        return await self.backend.stats()


def long_engine() -> dict:
    """A fake engine whose requests can run long enough to be caught in flight."""
    return dict(max_model_len=60_000, num_gpu_blocks=4096)


def stats_of(engine: AsyncEngine):
    import asyncio
    return asyncio.run(engine.stats())
