"""Flow control: the admission bound answers 429 + Retry-After, the open-request bound 503 in
the OpenAI error shape, and a client that leaves (mid-stream, or before a whole answer) has its
request aborted in the scheduler."""
from __future__ import annotations

import json
import socket
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
from gateway_helpers import Recording, long_engine, stats_of


def open_long_stream(client: httpx.Client, url: str, max_tokens: int = 50_000):
    body = {"prompt": "long", "max_tokens": max_tokens, "ignore_eos": True, "stream": True}
    stream = client.stream("POST", url + "/v1/completions", json=body)
    lines = stream.__enter__().iter_lines()
    next(line for line in lines if line.startswith("data:"))
    # The line iterator is returned too: dropping it would close the response.
    return stream, lines


def wait_until(predicate, timeout_s: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return False


def test_queue_bound_answers_429_with_retry_after(gateway_factory):
    # One running seat, held by a long stream; two may wait; the rest are turned away.
    gw = gateway_factory(engine_kwargs={**long_engine(), "max_num_seqs": 1}, max_waiting=2,
                         max_tokens_limit=60_000, retry_after_s=3)
    client = httpx.Client(timeout=60)
    stream, lines = open_long_stream(client, gw.url)      # holds the only running seat
    body = {"prompt": "wait", "max_tokens": 2}
    with ThreadPoolExecutor(5) as pool:
        futures = []
        for _ in range(5):     # spaced beyond the stats interval: each sees a fresh queue length
            futures.append(pool.submit(client.post, gw.url + "/v1/completions", json=body))
            time.sleep(0.15)
        assert wait_until(lambda: sum(f.done() for f in futures) >= 3)
        stream.__exit__(None, None, None)                  # frees the seat: the queued two run
        responses = [f.result() for f in futures]
    statuses = sorted(r.status_code for r in responses)
    assert statuses == [200, 200, 429, 429, 429]
    for r in responses:
        if r.status_code == 429:
            assert r.headers["retry-after"] == "3"
            assert r.json()["error"]["type"] == "rate_limit_error"


def test_disconnect_mid_stream_aborts_the_request(gateway_factory):
    gw = gateway_factory(engine_kwargs=long_engine(), wrap=Recording, max_tokens_limit=60_000)
    client = httpx.Client(timeout=60)
    stream, lines = open_long_stream(client, gw.url)
    assert stats_of(gw.engine).num_running == 1
    stream.__exit__(None, None, None)
    client.close()
    assert wait_until(lambda: stats_of(gw.engine).num_running == 0, timeout_s=10)
    stats = stats_of(gw.engine)
    assert stats.num_waiting == 0 and stats.num_free_blocks == stats.num_total_blocks
    # The engine frees the request before the gateway's coroutine resumes to note it.
    assert wait_until(lambda: len(gw.backend.aborted) == len(gw.backend.closed_early) == 1,
                      timeout_s=10)
    assert gw.backend.closed_early == gw.backend.aborted


def test_disconnect_before_a_whole_answer_aborts_the_request(gateway_factory):
    """Non-streaming: nothing is sent until the end, so only the disconnect says the client
    left; the request must not run on to max_tokens."""
    gw = gateway_factory(engine_kwargs=long_engine(), wrap=Recording, max_tokens_limit=60_000)
    host, port = gw.url.removeprefix("http://").split(":")
    body = json.dumps({"prompt": "long", "max_tokens": 50_000, "ignore_eos": True}).encode()
    sock = socket.create_connection((host, int(port)))
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                 b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    assert wait_until(lambda: stats_of(gw.engine).num_running == 1)
    sock.close()
    assert wait_until(lambda: stats_of(gw.engine).num_running == 0, timeout_s=10)
    stats = stats_of(gw.engine)
    assert stats.num_waiting == 0 and stats.num_free_blocks == stats.num_total_blocks
    assert wait_until(lambda: len(gw.backend.aborted) == len(gw.backend.closed_early) == 1,
                      timeout_s=10)
    assert gw.backend.closed_early == gw.backend.aborted


def test_over_the_open_request_bound_is_503_in_the_openai_error_shape(gateway_factory):
    gw = gateway_factory(engine_kwargs=long_engine(), max_tokens_limit=60_000,
                         max_concurrency=1, retry_after_s=2)
    client = httpx.Client(timeout=60)
    stream, lines = open_long_stream(client, gw.url)          # the one open request
    refused = client.post(gw.url + "/v1/completions", json={"prompt": "x", "max_tokens": 2})
    assert refused.status_code == 503 and refused.headers["retry-after"] == "2"
    error = refused.json()["error"]
    assert error["type"] == "service_unavailable" and error["code"] == "overloaded"
    assert client.get(gw.url + "/health").status_code == 200     # health is never refused
    with pytest.raises(openai.APIStatusError) as err:
        gw.client().completions.create(model="fake", prompt="x", max_tokens=2)
    assert err.value.status_code == 503 and err.value.body["code"] == "overloaded"
    stream.__exit__(None, None, None)
    assert wait_until(lambda: client.post(gw.url + "/v1/completions",
                                          json={"prompt": "x", "max_tokens": 2}).status_code
                      == 200)
    client.close()
