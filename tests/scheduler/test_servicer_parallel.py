"""``n > 1`` through every front (the in-process AsyncEngine, the gRPC client with a stream per
request or multiplexed): the choices, their tokens, text, finish reasons and logprobs are the
offline engine's, each delta names its choice, and an abort ends every choice."""
from __future__ import annotations

import asyncio

from lenserve.client import Client
from lenserve_contract.sampling_params import SamplingParams
from tests.scheduler.test_servicer import front, offline, served, slow_iterations  # noqa: F401

PARAMS = dict(max_tokens=7, seed=3, ignore_eos=True, n=3, logprobs=2)


async def collect_choices(front, prompt, request_id, **params):
    joined: dict[int, dict] = {}
    outs = []
    async for out in front.generate(prompt, SamplingParams(**params), request_id):
        outs.append(out)
        for c in out.outputs:
            j = joined.setdefault(c.index, {"tokens": [], "text": "", "logprobs": [],
                                            "finish": None})
            j["tokens"] += c.token_ids
            j["text"] += c.text
            j["logprobs"] += c.logprobs or []
            j["finish"] = c.finish_reason or j["finish"]
    return joined, outs


async def test_every_front_returns_the_offline_choices(front):
    joined, outs = await collect_choices(front, "parallel sampling", "p", **PARAMS)
    final = offline(["parallel sampling"], **PARAMS)["s0"]
    assert sorted(joined) == [0, 1, 2]
    for c in final.outputs:
        got = joined[c.index]
        assert (got["tokens"], got["text"], got["finish"]) == (c.token_ids, c.text, "length")
        assert [e.token_id for e in got["logprobs"]] == c.token_ids
        assert all(len(e.top) == 2 for e in got["logprobs"])
    assert len({tuple(j["tokens"]) for j in joined.values()}) == 3
    assert outs[-1].finished and not any(o.finished for o in outs[:-1])


async def test_an_abort_ends_every_choice(front, served, monkeypatch):
    slow_iterations(served[0], monkeypatch)
    stream = front.generate("abort all of us", SamplingParams(
        max_tokens=500, cap_max_tokens=True, ignore_eos=True, n=3), "ab")
    first = await stream.__anext__()
    assert not first.finished and await front.abort("ab")
    reasons = {c.index: c.finish_reason for out in [first] + [o async for o in stream]
               for c in out.outputs if c.finish_reason}
    assert reasons == {0: "abort", 1: "abort", 2: "abort"}
    for _ in range(100):
        stats = await front.stats()
        if stats.num_running == stats.num_waiting == 0:
            break
        await asyncio.sleep(0.02)
    assert (stats.num_running, stats.num_waiting, stats.num_free_blocks) == (0, 0, 64)


async def test_the_sync_client_joins_each_choice(served):
    _, target = served
    expected = offline(["sync n"], **PARAMS)["s0"]
    with Client(target) as client:
        out = await asyncio.to_thread(client.generate_all, "sync n", SamplingParams(**PARAMS))
    assert [(c.index, c.token_ids, c.text, c.finish_reason) for c in out.outputs] == [
        (c.index, c.token_ids, c.text, c.finish_reason) for c in expected.outputs]
    assert [[e.token_id for e in c.logprobs] for c in out.outputs] == [
        c.token_ids for c in expected.outputs]
