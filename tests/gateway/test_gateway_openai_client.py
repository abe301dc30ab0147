"""The standard ``openai`` client against a live gateway: the API as chat apps see it."""
from __future__ import annotations

import json

import httpx

from gateway_helpers import API_KEY

AUTH = {"Authorization": f"Bearer {API_KEY}"}


def test_completion_text_and_usage(client):
    out = client.completions.create(model="fake", prompt="Hello", max_tokens=7,
                                extra_body={"ignore_eos": True})
    assert out.object == "text_completion" and out.model == "fake"
    assert out.choices[0].finish_reason == "length"
    assert len(out.choices[0].text) == 7           # the fake model emits one printable byte a token
    assert (out.usage.prompt_tokens, out.usage.completion_tokens, out.usage.total_tokens) == (5, 7, 12)


def test_completion_accepts_token_ids(client):
    out = client.completions.create(model="fake", prompt=[72, 105], max_tokens=3)
    assert out.usage.prompt_tokens == 2 and out.usage.completion_tokens == 3


def test_same_request_same_text(client):
    a = client.completions.create(model="fake", prompt="Hi", max_tokens=5, temperature=0)
    b = client.completions.create(model="fake", prompt="Hi", max_tokens=5, temperature=0)
    assert a.choices[0].text == b.choices[0].text


def test_chat_uses_the_plain_fallback_prompt(client):
    out = client.chat.completions.create(
        model="fake", max_tokens=4,
        messages=[{"role": "system", "content": "Be terse."}, {"role": "user", "content": "hi"}])
    expected_prompt = "system: Be terse.\nuser: hi\nassistant:"
    assert out.object == "chat.completion"
    assert out.choices[0].message.role == "assistant" and len(out.choices[0].message.content) == 4
    assert out.usage.prompt_tokens == len(expected_prompt.encode())
    assert out.usage.completion_tokens == 4


def test_streamed_completion_matches_the_whole_one(client):
    whole = client.completions.create(model="fake", prompt="abc", max_tokens=9, temperature=0)
    chunks = list(client.completions.create(model="fake", prompt="abc", max_tokens=9,
                                            temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == whole.choices[0].text
    assert chunks[-2].choices[0].finish_reason == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 9
    assert all(c.usage is None for c in chunks[:-1])


def test_streamed_chat(client):
    chunks = list(client.chat.completions.create(
        model="fake", messages=[{"role": "user", "content": "hello"}], max_tokens=6,
        stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len(text) == 6
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage.prompt_tokens == len(b"user: hello\nassistant:")


def test_stream_without_usage_has_none(client):
    chunks = list(client.completions.create(model="fake", prompt="x", max_tokens=3, stream=True))
    assert chunks and all(c.usage is None for c in chunks)


def test_sse_framing_ends_with_done(live):
    body = {"model": "fake", "prompt": "frame", "max_tokens": 5, "stream": True,
            "stream_options": {"include_usage": True}}
    with httpx.stream("POST", live.url + "/v1/completions", json=body, headers=AUTH) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        raw = resp.read().decode()
    events = raw.split("\n\n")
    assert events[-1] == "" and events[-2] == "data: [DONE]"
    payloads = [json.loads(e[len("data: "):]) for e in events[:-2]]
    assert all(e.startswith("data: ") for e in events[:-1])
    assert payloads[-1]["usage"]["completion_tokens"] == 5
    assert len({p["id"] for p in payloads}) == 1


def test_models_lists_the_served_model(client):
    assert [m.id for m in client.models.list().data] == ["fake"]


def test_health_is_open(live):
    assert httpx.get(live.url + "/health").json() == {"status": "ok"}


def test_lenserve_extensions_are_accepted(client):
    out = client.completions.create(model="fake", prompt="p", max_tokens=2,
                                    extra_body={"priority": 3, "slo_ms": 250})
    assert out.usage.completion_tokens == 2
