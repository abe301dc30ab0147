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


class ServedScheduler:
    """An engine behind the real gRPC scheduler service on a background event loop; ``backend``
    is what ``python -m gateway`` puts in front of it."""

    def __init__(self, engine: AsyncEngine):
        import asyncio
        import threading

        from gateway.__main__ import LazySchedulerClient
        from services.scheduler.servicer import build_server, mark_serving

        async def start():
            server, port = build_server(engine, "127.0.0.1:0")
            await server.start()
            await mark_serving(server)
            return server, port

        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self.server, port = self._run(start())
        self.backend = LazySchedulerClient(f"127.0.0.1:{port}")

    def _run(self, coro):
        import asyncio
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=30)

    def stop(self) -> None:
        self._run(self.server.stop(grace=0))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
