import asyncio
import time

import pytest
from engine_helpers import make_engine, run_to_completion

from services.executor.fake import FakeExecutor
from services.scheduler.async_engine import AsyncEngine
from lenserve_contract.sampling_params import InvalidRequestError, SamplingParams


@pytest.fixture
def engine():
    e = AsyncEngine(make_engine(num_gpu_blocks=32))
    yield e
    e.shutdown()


async def collect(engine, prompt, request_id, **params):
    tokens, text, outs = [], "", []
    async for out in engine.generate(prompt, SamplingParams(temperature=0, **params), request_id):
        tokens += out.outputs[0].token_ids
        text += out.outputs[0].text
        outs.append(out)
    return tokens, text, outs


async def test_concurrent_streams_match_offline_generation(engine):
    prompts = [f"stream {i} " * (i + 1) for i in range(5)]
    results = await asyncio.gather(*(collect(engine, p, f"s{i}", max_tokens=10)
                                     for i, p in enumerate(prompts)))
    offline = make_engine(num_gpu_blocks=32)
    for i, p in enumerate(prompts):
        offline.add_request(f"s{i}", prompt=p, sampling_params=SamplingParams(temperature=0, max_tokens=10))
    expected = run_to_completion(offline)
    for i, (tokens, text, outs) in enumerate(results):
        final = expected[f"s{i}"].outputs[0]
        assert (tokens, text) == (final.token_ids, final.text)
        assert outs[-1].finished and not any(o.finished for o in outs[:-1])
        assert all(len(o.outputs[0].token_ids) == 1 for o in outs)   # one delta per token


async def test_bad_request_raises_and_other_streams_continue(engine):
    good = asyncio.ensure_future(collect(engine, "fine", "ok", max_tokens=20))
    with pytest.raises(InvalidRequestError, match="empty"):
        await collect(engine, "", "bad", max_tokens=5)
    tokens, _, outs = await good
    assert len(tokens) == 20 and outs[-1].outputs[0].finish_reason == "length"


async def test_abort_ends_the_stream(engine):
    params = SamplingParams(max_tokens=10_000, ignore_eos=True, cap_max_tokens=True)
    stream = engine.generate("long one", params, "x")
    first = await stream.__anext__()
    assert not first.finished
    assert await engine.abort("x")
    outs = [out async for out in stream]
    assert outs[-1].finished and outs[-1].outputs[0].finish_reason == "abort"
    assert not await engine.abort("x")


async def test_closing_the_stream_early_aborts_the_request(engine):
    stream = engine.generate("long one", SamplingParams(max_tokens=10_000, cap_max_tokens=True),
                             "y")
    await stream.__anext__()
    await stream.aclose()
    stats = await engine.stats()
    assert stats.num_running == 0 and stats.num_free_blocks == 32


async def test_event_loop_stays_responsive_while_generating(engine, monkeypatch):
    # The fake model is instant: on a fast machine the engine thread can run all 60
    # iterations before the loop wakes twice. A millisecond per iteration gives the loop
    # 60 ms to show it is not blocked.
    real_execute = FakeExecutor.execute

    def slow_execute(self, batch):
        time.sleep(0.001)
        return real_execute(self, batch)

    monkeypatch.setattr(FakeExecutor, "execute", slow_execute)
    ticks = 0

    async def ticker():
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    task = asyncio.ensure_future(ticker())
    await collect(engine, "responsive", "r", max_tokens=60)
    task.cancel()
    assert ticks > 60


def test_a_callers_closed_event_loop_does_not_stop_the_engine():
    """Outputs for a request whose caller's event loop has closed are dropped; the engine
    thread goes on serving the requests of other loops."""
    e = AsyncEngine(make_engine(num_gpu_blocks=32))
    try:
        left = asyncio.new_event_loop()

        async def start_and_leave():
            stream = e.generate("left behind", SamplingParams(max_tokens=40, ignore_eos=True),
                                "gone")
            await anext(stream)          # the stream stays open; its loop closes under it

        left.run_until_complete(start_and_leave())
        left.close()

        async def other():
            return await asyncio.wait_for(collect(e, "still served", "kept", max_tokens=8), 60)

        tokens, _, outs = asyncio.run(other())
        assert len(tokens) == 8 and outs[-1].finished
        assert e.error is None and e._thread.is_alive()
    finally:
        e.shutdown()
