"""Fixtures: one live gateway (API key, small limits) per test module, and a factory of
gateways that a test configures itself."""
from __future__ import annotations

import openai
import pytest
from gateway_helpers import API_KEY, start_gateway


@pytest.fixture(scope="module")
def live():
    gw, server = start_gateway(api_keys=(API_KEY,), max_body_bytes=64 * 1024,
                               max_prompt_len=2000, max_tokens_limit=512)
    yield gw
    server.stop()
    gw.engine.shutdown()


@pytest.fixture
def client(live) -> openai.OpenAI:
    return live.client(API_KEY)


@pytest.fixture
def gateway_factory():
    """``make(...)`` starts a gateway with ``start_gateway``'s arguments; all are stopped after
    the test."""
    started = []

    def make(*args, **kwargs):
        gw, server = start_gateway(*args, **kwargs)
        started.append((gw, server))
        return gw
    yield make
    for gw, server in started:
        server.stop()
        gw.engine.shutdown()
