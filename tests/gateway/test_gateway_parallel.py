"""``n > 1`` through the official ``openai`` client: n choices with their index, whole and
streamed (a chunk per choice), usage counting the prompt once and every choice's tokens,
logprobs per choice, the configurable bound, and a client that leaves mid-stream aborting
every choice; over the in-process engine and over the gRPC scheduler service."""
from __future__ import annotations

import httpx
import openai
import pytest
from gateway_helpers import API_KEY, ServedScheduler, long_engine, stats_of
from test_gateway_flow import wait_until

MESSAGES = [{"role": "user", "content": "three answers"}]


@pytest.fixture(scope="module", params=["engine", "grpc"])
def gw(request):
    from gateway_helpers import start_gateway
    served = []

    def wrap(engine):
        served.append(ServedScheduler(engine))
        return served[0].backend
    live, server = start_gateway(wrap=wrap if request.param == "grpc" else None,
                                 api_keys=(API_KEY,), max_n=4)
    yield live
    server.stop()
    for s in served:
        s.stop()
    live.engine.shutdown()


@pytest.fixture
def client(gw) -> openai.OpenAI:
    return gw.client(API_KEY)


def complete(client, **kw):
    return client.completions.create(**{"model": "fake", "prompt": "Hello there", "max_tokens": 7,
                                        "extra_body": {"ignore_eos": True}, **kw})


def joined(chunks, field):
    """Per choice index: the streamed text and the last finish reason."""
    text, reasons = {}, {}
    for chunk in chunks:
        for c in chunk.choices:
            piece = c.text if field == "text" else (c.delta.content or "")
            text[c.index] = text.get(c.index, "") + piece
            if c.finish_reason:
                reasons[c.index] = c.finish_reason
    return text, reasons


def test_greedy_choices_equal_the_single_answer(client):
    one = complete(client, temperature=0)
    three = complete(client, temperature=0, n=3)
    assert [c.index for c in three.choices] == [0, 1, 2]
    assert [c.text for c in three.choices] == [one.choices[0].text] * 3
    assert (three.usage.prompt_tokens, three.usage.completion_tokens,
            three.usage.total_tokens) == (11, 21, 32)


def test_seeded_choices_differ_repeat_and_stream_alike(client):
    a, b = complete(client, seed=4, n=3), complete(client, seed=4, n=3)
    texts = [c.text for c in a.choices]
    assert texts == [c.text for c in b.choices] and len(set(texts)) == 3
    chunks = list(complete(client, seed=4, n=3, stream=True,
                           stream_options={"include_usage": True}))
    text, reasons = joined(chunks, "text")
    assert [text[i] for i in range(3)] == texts and reasons == {0: "length", 1: "length",
                                                                 2: "length"}
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 21
    assert all(len(c.choices) == 1 for c in chunks[:-1])


def test_chat_choices_whole_and_streamed(client):
    whole = client.chat.completions.create(model="fake", messages=MESSAGES, max_tokens=5,
                                           seed=9, n=3)
    assert [c.index for c in whole.choices] == [0, 1, 2]
    assert whole.usage.completion_tokens == sum(len(c.message.content) for c in whole.choices)
    chunks = list(client.chat.completions.create(model="fake", messages=MESSAGES, max_tokens=5,
                                                 seed=9, n=3, stream=True))
    assert [(c.index, c.delta.role) for c in chunks[0].choices] == [
        (0, "assistant"), (1, "assistant"), (2, "assistant")]
    text, reasons = joined(chunks, "content")
    assert [text[i] for i in range(3)] == [c.message.content for c in whole.choices]
    assert set(reasons) == {0, 1, 2}


def test_logprobs_per_choice(client):
    whole = complete(client, seed=1, n=2, logprobs=2)
    for c in whole.choices:
        lp = c.logprobs
        # The fake model's tokens are bytes, named by id (it has no token texts).
        assert lp.tokens == [f"token_id:{ord(ch)}" for ch in c.text]
        assert len(lp.token_logprobs) == len(lp.top_logprobs) == 7
        assert lp.text_offset[0] == 0
    chunks = list(complete(client, seed=1, n=2, logprobs=2, stream=True))
    for i in range(2):
        offsets = [o for ch in chunks for c in ch.choices if c.index == i and c.logprobs
                   for o in c.logprobs.text_offset]
        assert offsets == whole.choices[i].logprobs.text_offset
    chat = client.chat.completions.create(model="fake", messages=MESSAGES, max_tokens=4, n=2,
                                          logprobs=True, top_logprobs=1)
    assert all(len(c.logprobs.content) == 4 for c in chat.choices)


def test_n_above_the_configured_bound_is_400(client, gw):
    with pytest.raises(openai.BadRequestError, match=r"\[1, 4\]") as err:
        complete(client, n=5)
    assert err.value.body["param"] == "n" and err.value.status_code == 400
    schema = httpx.get(gw.url + "/openapi.json",
                       headers={"Authorization": f"Bearer {API_KEY}"}).json()
    assert schema["components"]["schemas"]["ChatCompletionRequest"]["properties"]["n"][
        "maximum"] == 4


def test_leaving_mid_stream_aborts_every_choice(gateway_factory):
    gw = gateway_factory(engine_kwargs=long_engine(), max_tokens_limit=60_000)
    client = httpx.Client(timeout=60)
    body = {"prompt": "long " * 20, "max_tokens": 50_000, "ignore_eos": True, "stream": True,
            "n": 3}
    with client.stream("POST", gw.url + "/v1/completions", json=body) as stream:
        lines = stream.iter_lines()
        next(line for line in lines if line.startswith("data:"))
        assert wait_until(lambda: stats_of(gw.engine).num_running == 3)
    client.close()
    assert wait_until(lambda: stats_of(gw.engine).num_running == 0, timeout_s=10)
    stats = stats_of(gw.engine)
    assert stats.num_waiting == 0 and stats.num_free_blocks == stats.num_total_blocks
    assert not gw.engine.engine.groups.by_parent
