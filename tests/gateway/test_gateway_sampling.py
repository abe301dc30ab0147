"""The official ``openai`` client exercising every sampling parameter the gateway added,
whole and streamed, against a random-weight model (opt-tiny with a byte-level tokenizer):
logprobs and top_logprobs in both response shapes, seeds, penalties, min_p, logit_bias,
response_format (json_object, json_schema), truncation, and stop strings across tokens."""
from __future__ import annotations

import json

import openai
import pytest

from gateway import GatewayConfig, create_app
from gateway.server import ServerThread
from services.scheduler.async_engine import AsyncEngine
from services.scheduler.engine_core import EngineCore
from services.scheduler.wiring import EngineConfig, engine_parts
from tests.executor.sampling_models import byte_bpe_tokenizer, json_executor

pytest.importorskip("xgrammar")
SCHEMA = {"type": "object", "additionalProperties": False, "required": ["city", "rank"],
          "properties": {"city": {"type": "string", "maxLength": 5},
                         "rank": {"type": "integer", "minimum": 1, "maximum": 9}}}
MESSAGES = [{"role": "user", "content": "Name a city."}]


@pytest.fixture(scope="module")
def tiny():
    executor = json_executor(num_gpu_blocks=256, block_size=16, max_model_len=128)
    core = EngineCore(**engine_parts(EngineConfig(model="opt-tiny", max_model_len=128),
                                     executor))
    engine = AsyncEngine(core)
    app = create_app(engine, GatewayConfig(served_model_name="tiny"),
                     tokenizer=executor.tokenizer)
    server = ServerThread(app).start()
    yield openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
    server.stop()
    engine.shutdown()


def complete(client, stream=False, **kw):
    kw = {"model": "tiny", "prompt": "Hello", "max_tokens": 8, **kw}
    if not stream:
        return client.completions.create(**kw)
    return list(client.completions.create(stream=True, **kw))


def test_completion_logprobs_whole_and_streamed(tiny):
    whole = complete(tiny, temperature=0, logprobs=3, extra_body={"ignore_eos": True})
    lp = whole.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 8
    for token_lp, top in zip(lp.token_logprobs, lp.top_logprobs):
        assert len(top) <= 3 and token_lp <= 0
        # Greedy: the most likely. (Ids past this small vocabulary all read "", so the dict,
        # keyed by text, may hold fewer than three.)
        assert token_lp >= max(top.values()) - 1e-4
    assert lp.text_offset == sorted(lp.text_offset) and lp.text_offset[0] == 0
    chunks = complete(tiny, stream=True, temperature=0, logprobs=3,
                      extra_body={"ignore_eos": True})
    streamed = [v for c in chunks if c.choices and c.choices[0].logprobs
                for v in c.choices[0].logprobs.token_logprobs]
    assert streamed == pytest.approx(lp.token_logprobs, abs=1e-5)


def test_chat_logprobs_whole_and_streamed(tiny):
    whole = tiny.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=5,
                                         temperature=0, logprobs=True, top_logprobs=2,
                                         extra_body={"ignore_eos": True})
    content = whole.choices[0].logprobs.content
    assert len(content) == 5
    for entry in content:
        assert len(entry.top_logprobs) == 2 and entry.bytes == list(entry.token.encode())
        assert entry.logprob == pytest.approx(entry.top_logprobs[0].logprob, abs=1e-4)
    chunks = list(tiny.chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=5, temperature=0, logprobs=True,
        stream=True, extra_body={"ignore_eos": True}))
    streamed = [e for c in chunks if c.choices and c.choices[0].logprobs
                for e in c.choices[0].logprobs.content]
    assert [e.logprob for e in streamed] == pytest.approx([e.logprob for e in content], abs=1e-5)
    assert all(e.top_logprobs == [] for e in streamed)       # top_logprobs defaults to 0


def test_a_seed_repeats_and_no_seed_does_not(tiny):
    def draw(**kw):
        out = complete(tiny, temperature=1.0, logprobs=0, max_tokens=12,
                       extra_body={"ignore_eos": True}, **kw)
        return out.choices[0].logprobs.token_logprobs
    assert draw(seed=7) == draw(seed=7)
    assert draw(seed=7) != draw(seed=8)
    assert draw() != draw()      # fresh entropy: never a stream fixed at start-up


def test_penalties_change_what_greedy_decoding_repeats(tiny):
    def tokens(**kw):
        out = complete(tiny, temperature=0, logprobs=0, max_tokens=24,
                       extra_body={"ignore_eos": True, **kw.pop("extra", {})}, **kw)
        return out.choices[0].logprobs.token_logprobs
    plain = tokens()
    for kw in ({"frequency_penalty": 2.0}, {"presence_penalty": 2.0},
               {"extra": {"repetition_penalty": 1.9}}):
        assert tokens(**kw) != plain, kw
    streamed = complete(tiny, stream=True, temperature=0, max_tokens=6, presence_penalty=1.0,
                        frequency_penalty=0.5, extra_body={"min_p": 0.1, "ignore_eos": True})
    assert streamed[-1].choices[0].finish_reason == "length"


def test_logit_bias_forces_a_token(tiny):
    out = complete(tiny, temperature=1.0, logit_bias={"65": 100}, logprobs=0,
                   extra_body={"ignore_eos": True})
    assert set(out.choices[0].logprobs.tokens) == {byte_bpe_tokenizer().decode([65])}


def test_json_schema_whole_and_streamed(tiny):
    fmt = {"type": "json_schema", "json_schema": {"name": "city", "schema": SCHEMA,
                                                  "strict": True}}
    for seed in (1, 2):
        whole = tiny.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=60,
                                             seed=seed, response_format=fmt)
        value = json.loads(whole.choices[0].message.content, strict=False)
        assert set(value) == {"city", "rank"} and 1 <= value["rank"] <= 9
        chunks = list(tiny.chat.completions.create(model="tiny", messages=MESSAGES,
                                                   max_tokens=60, seed=seed,
                                                   response_format=fmt, stream=True))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text == whole.choices[0].message.content


def test_json_object(tiny):
    out = tiny.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=20, seed=3,
                                       response_format={"type": "json_object"})
    assert out.choices[0].message.content.startswith("{")


def test_bad_parameters_are_400_naming_them(tiny):
    cases = [({"logprobs": 21}, "logprobs"), ({"presence_penalty": 3}, "presence_penalty"),
             ({"logit_bias": {"999999": 1}}, "logit_bias"),
             ({"max_tokens": 128}, "max_tokens"),
             ({"extra_body": {"response_format": {"type": "json_schema", "json_schema": {
                 "name": "x", "schema": {"type": "object", "properties": {
                     "a": {"type": "strin"}}}}}}}, "response_format")]
    for kw, param in cases:
        with pytest.raises(openai.BadRequestError) as err:
            complete(tiny, **kw)
        assert err.value.body["param"] == param, kw


def test_truncation_is_opt_in(tiny):
    long_prompt = "Hello world " * 40      # about 80 tokens; 80 + 100 > 128
    with pytest.raises(openai.BadRequestError, match="maximum context length"):
        complete(tiny, prompt=long_prompt, max_tokens=100)
    out = complete(tiny, prompt=long_prompt, max_tokens=100,
                   extra_body={"truncate_prompt_tokens": -1, "ignore_eos": True})
    assert out.usage.prompt_tokens == 28 and out.usage.completion_tokens == 100
    capped = complete(tiny, prompt=long_prompt, max_tokens=100,
                      extra_body={"cap_max_tokens": True, "ignore_eos": True})
    assert capped.usage.total_tokens == 128 and capped.choices[0].finish_reason == "length"


def test_a_stop_string_spanning_tokens_cuts_the_text(client):
    """On the fake model (one printable byte a token) any two-character stop string spans a
    token boundary."""
    whole = client.completions.create(model="fake", prompt="abc", max_tokens=12, temperature=0)
    text = whole.choices[0].text
    stop = text[5:7]
    first = text.find(stop)
    for stream in (False, True):
        out = client.completions.create(model="fake", prompt="abc", max_tokens=12,
                                        temperature=0, stop=[stop], stream=stream)
        got = ("".join(c.choices[0].text for c in out if c.choices) if stream
               else out.choices[0].text)
        assert got == text[:first]
