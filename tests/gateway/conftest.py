"""Fixtures: one live gateway (API key, small limits) per test module."""
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
