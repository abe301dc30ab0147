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

    def client(self, key: str | None = None, **kwargs) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key=key or "none", max_retries=0,
                             **kwargs)


def start_gateway(engine_kwargs: dict | None = None, **config_kwargs) -> tuple[Live, ServerThread]:
    engine = AsyncEngine(EngineConfig(model="fake", **(engine_kwargs or {})))
    config = GatewayConfig(served_model_name="fake", **config_kwargs)
    app = create_app(engine, config, tokenizer=engine.engine.tokenizer)
    server = ServerThread(app).start()
    return Live(server.url, engine, app, config), server
