"""Refusals: 401 without a key, 413 for oversize bodies, 400 for bad parameters, all in OpenAI's
error shape and never a 5xx."""
from __future__ import annotations

import httpx
import openai
import pytest

from gateway_helpers import API_KEY

AUTH = {"Authorization": f"Bearer {API_KEY}"}


def post(live, path: str, body, headers=AUTH, **kwargs) -> httpx.Response:
    return httpx.post(live.url + path, json=body, headers=headers, timeout=30, **kwargs)


def assert_error_shape(resp: httpx.Response, status: int) -> dict:
    assert resp.status_code == status, resp.text
    error = resp.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    return error


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"},
                                     {"Authorization": API_KEY}, {"Authorization": "Basic x"}])
def test_missing_or_wrong_key_is_401_and_says_nothing_more(live, headers):
    body = {"model": "fake", "prompt": "secret prompt", "max_tokens": 3}
    resp = post(live, "/v1/completions", body, headers=headers)
    error = assert_error_shape(resp, 401)
    assert error["code"] == "invalid_api_key" and resp.headers["www-authenticate"] == "Bearer"
    assert "secret" not in resp.text and "fake" not in resp.text
    assert httpx.get(live.url + "/v1/models", headers=headers).status_code == 401
    assert httpx.get(live.url + "/metrics", headers=headers).status_code == 401


def test_openai_client_raises_authentication_error(live):
    with pytest.raises(openai.AuthenticationError):
        live.client("wrong").completions.create(model="fake", prompt="x", max_tokens=1)


def test_oversize_body_is_413(live):
    body = {"model": "fake", "prompt": "x" * (live.config.max_body_bytes + 1), "max_tokens": 1}
    assert_error_shape(post(live, "/v1/completions", body), 413)


def test_oversize_chunked_body_is_413(live):
    chunks = (b"x" * 4096 for _ in range(live.config.max_body_bytes // 4096 + 2))
    resp = httpx.post(live.url + "/v1/completions", content=chunks, headers=AUTH)
    assert_error_shape(resp, 413)


@pytest.mark.parametrize("body, param", [
    ({"prompt": "x", "max_tokens": 0}, "max_tokens"),
    ({"prompt": "x", "max_tokens": 100_000}, "max_tokens"),
    ({"prompt": "x", "temperature": -1}, "temperature"),
    ({"prompt": "x", "top_p": 0}, "top_p"),
    ({"prompt": "x", "n": 17}, "n"),           # above the default --max-n (16)
    ({"prompt": "x", "n": 0}, "n"),
    ({"prompt": "x", "n": 129}, "n"),          # above any --max-n
    ({"prompt": "x", "logprobs": 21}, "logprobs"),
    ({"prompt": "x", "presence_penalty": 2.5}, "presence_penalty"),
    ({"prompt": "x", "frequency_penalty": -3}, "frequency_penalty"),
    ({"prompt": "x", "repetition_penalty": 0}, "repetition_penalty"),
    ({"prompt": "x", "min_p": 1.5}, "min_p"),
    ({"prompt": "x", "logit_bias": {"300": 1}}, "logit_bias"),      # the fake's vocab is 257
    ({"prompt": "x", "logit_bias": {"5": 101}}, "logit_bias"),
    ({"prompt": "x", "logit_bias": {"five": 1}}, "logit_bias"),
    ({"prompt": "x", "truncate_prompt_tokens": 0}, "truncate_prompt_tokens"),
    ({"prompt": "y" * 1990, "max_tokens": 512}, "max_tokens"),     # beyond the 2048 context
    ({"prompt": "x", "response_format": {"type": "json_schema", "json_schema": {
        "name": "n", "schema": {"type": "objec"}}}}, "response_format"),
    ({"prompt": "x", "response_format": {"type": "json_schema"}}, "response_format"),
    ({"prompt": "x", "stop": [""]}, "stop"),
    ({"prompt": "x", "min_tokens": 99, "max_tokens": 3}, "min_tokens"),
    ({"prompt": "x", "slo_ms": -5}, "slo_ms"),
    ({"prompt": ["a", "b"]}, "prompt"),
    ({"prompt": "y" * 2001}, "prompt"),
    ({"prompt": [300]}, "prompt_token_ids"),
    ({"prompt": ""}, "prompt"),
    ({"max_tokens": 3}, "prompt"),
    ({"prompt": "x", "seed": -1}, "seed"),
    # found by the schemathesis run: the value max_tokens overrides is still checked
    ({"prompt": "x", "max_tokens": 3, "max_completion_tokens": 100_000}, "max_completion_tokens"),
    # types are strict, as the OpenAPI schema says: no coercion of 0 to false, etc.
    ({"prompt": "x", "echo": 0}, "echo"),
    ({"prompt": "x", "stream": 1}, "stream"),
    ({"prompt": "x", "max_tokens": "5"}, "max_tokens"),
    ({"prompt": "x", "temperature": True}, "temperature"),
])
def test_bad_completion_params_are_400(live, body, param):
    error = assert_error_shape(post(live, "/v1/completions", body), 400)
    assert error["param"] == param and error["type"] == "invalid_request_error"


@pytest.mark.parametrize("body", [
    {"messages": []},
    {"messages": [{"role": "wizard", "content": "x"}]},
    {"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]},
    {"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2},
    {"messages": [{"role": "user", "content": "x"}], "logprobs": True, "top_logprobs": 21},
    {"messages": [{"role": "user", "content": "x"}], "tool_choice": "required"},
    {"messages": "hello"},
])
def test_bad_chat_bodies_are_400(live, body):
    assert_error_shape(post(live, "/v1/chat/completions", body), 400)


@pytest.mark.parametrize("content", [b"{not json", b'{"prompt": "x",, "max_tokens": 1}'])
def test_malformed_json_is_400_and_says_so(live, content):
    resp = httpx.post(live.url + "/v1/completions", content=content, headers=AUTH)
    error = assert_error_shape(resp, 400)
    assert error["message"].startswith("malformed JSON in request body: ")
    assert "at character" in error["message"] and "JSON decode error" not in error["message"]
    assert error["param"] is None and error["code"] == "invalid_json"


def test_empty_body_is_400_asking_for_json(live):
    error = assert_error_shape(httpx.post(live.url + "/v1/completions", headers=AUTH), 400)
    assert "empty" in error["message"] and error["param"] is None


def test_lone_surrogate_is_400(live):
    resp = httpx.post(live.url + "/v1/completions", headers=AUTH,
                      content=b'{"prompt": "\\ud800", "max_tokens": 1}')
    assert assert_error_shape(resp, 400)["param"] == "prompt"


def test_unknown_model_is_404(live):
    error = assert_error_shape(post(live, "/v1/completions", {"model": "gpt-9", "prompt": "x"}), 404)
    assert error["code"] == "model_not_found"


def test_openai_client_raises_bad_request(client):
    with pytest.raises(openai.BadRequestError, match=r"n: must be in \[1, 16\]") as err:
        client.completions.create(model="fake", prompt="x", n=17)
    assert err.value.body["param"] == "n"


def test_unknown_path_is_404_in_error_shape(live):
    assert_error_shape(httpx.get(live.url + "/v1/nothing", headers=AUTH), 404)
