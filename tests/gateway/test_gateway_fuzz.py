"""Property-based fuzzing of request bodies: whatever a client sends, the answer is never a 5xx,
and every refusal is in OpenAI's error shape.

Bounded for CI (``LENSERVE_FUZZ_EXAMPLES``, default 300 per endpoint); set it to 1000 or more
for the full run."""
from __future__ import annotations

import json
import os

import httpx
import pytest
from gateway_helpers import API_KEY
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

EXAMPLES = int(os.environ.get("LENSERVE_FUZZ_EXAMPLES", "300"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
                suppress_health_check=list(HealthCheck))

scalars = (st.none() | st.booleans() | st.integers(-(2**70), 2**70)
           | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=20))
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=10)
small_ints = st.integers(-3, 40) | st.sampled_from([0, 1, 2**31, 2**63, -(2**63)])
floats = st.floats(-2, 3) | st.sampled_from([float("nan"), float("inf"), 0.0, 1.0])
texts = st.text(max_size=30)
messages = st.lists(st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "user", "assistant", "tool", "x"]),
     "content": texts | st.none() | st.lists(st.fixed_dictionaries(
         {"type": st.sampled_from(["text", "image_url"]), "text": texts}), max_size=2)}),
    max_size=3)
SAMPLING = {
    "model": st.sampled_from(["fake", "other"]) | json_values,
    "max_tokens": small_ints | json_values, "temperature": floats | json_values,
    "top_p": floats, "top_k": small_ints, "min_tokens": small_ints, "seed": small_ints,
    "stop": texts | st.lists(texts, max_size=3) | json_values, "n": small_ints,
    "stream": st.booleans() | json_values,
    "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}) | json_values,
    "ignore_eos": st.booleans(), "priority": small_ints | json_values,
    "slo_ms": floats | small_ints, "logprobs": st.none() | st.booleans() | small_ints,
    "presence_penalty": floats, "unknown_field": json_values,
    "frequency_penalty": floats | json_values, "repetition_penalty": floats, "min_p": floats,
    "top_logprobs": small_ints | json_values,
    "logit_bias": json_values | st.dictionaries(
        st.sampled_from(["1", "65", "256", "300", "-1", "x"]), floats, max_size=3),
    "response_format": st.fixed_dictionaries(
        {"type": st.sampled_from(["text", "json_object", "json_schema", "xml"])},
        optional={"json_schema": st.fixed_dictionaries({}, optional={
            "name": texts, "strict": st.booleans(),
            "schema": json_values | st.sampled_from([{"type": "object"}, {"type": "objec"},
                                                     {"enum": []}])})}) | json_values,
    "truncate_prompt_tokens": small_ints | json_values, "cap_max_tokens": st.booleans(),
    "tool_choice": st.sampled_from(["none", "auto", "required"]) | json_values
    | st.fixed_dictionaries({"type": st.sampled_from(["function", "x"]), "function":
                             st.fixed_dictionaries({"name": st.sampled_from(["f", "nope"])})}),
    "tools": json_values | st.lists(st.fixed_dictionaries(
        {"type": st.sampled_from(["function", "retrieval"]),
         "function": st.fixed_dictionaries({"name": st.sampled_from(["f", "g h", ""]) | texts},
                                           optional={"parameters": json_values | st.sampled_from(
                                               [{"type": "object"}, {"type": "objec"}])})}),
        max_size=2),
    "parallel_tool_calls": st.booleans() | json_values,
}
prompts = texts | st.lists(st.integers(-5, 300), max_size=8) | st.lists(texts, max_size=2) | json_values


def bodies(required: dict):
    optional = st.fixed_dictionaries({}, optional=SAMPLING)
    return st.tuples(st.fixed_dictionaries({}, optional=required), optional).map(
        lambda pair: {**pair[0], **pair[1]}) | json_values


@pytest.fixture(scope="module")
def http(live):
    with httpx.Client(base_url=live.url, headers={"Authorization": f"Bearer {API_KEY}"},
                      timeout=30) as client:
        yield client


def check(http: httpx.Client, path: str, body) -> None:
    content = json.dumps(body, allow_nan=True).encode()
    with http.stream("POST", path, content=content) as resp:
        raw = resp.read().decode()
    assert resp.status_code < 500, (body, raw)
    if resp.status_code != 200:
        error = json.loads(raw)["error"]
        assert set(error) == {"message", "type", "param", "code"}, raw
    elif resp.headers["content-type"].startswith("text/event-stream"):
        assert raw.endswith("data: [DONE]\n\n") and '"error"' not in raw, (body, raw)
    else:
        answer = json.loads(raw)
        n = body.get("n", 1)
        assert [c["index"] for c in answer["choices"]] == list(range(n)), (body, raw)
        assert answer["usage"]["completion_tokens"] >= n


@FUZZ
@given(body=bodies({"prompt": prompts}))
def test_completions_never_5xx(http, body):
    check(http, "/v1/completions", body)


@FUZZ
@given(body=bodies({"messages": messages | json_values}))
def test_chat_never_5xx(http, body):
    check(http, "/v1/chat/completions", body)
