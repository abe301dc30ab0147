"""A caller cancelled while its command is in flight must not take the engine thread down."""
from __future__ import annotations

import asyncio

from lenserve_contract.sampling_params import SamplingParams
from services.scheduler.async_engine import AsyncEngine
from services.scheduler.wiring import EngineConfig


async def test_cancelled_abort_still_aborts_and_the_engine_lives():
    engine = AsyncEngine(EngineConfig(model="fake", max_model_len=60_000, num_gpu_blocks=4096))
    params = SamplingParams(max_tokens=50_000, ignore_eos=True)
    try:
        stream = engine.generate("long", params, request_id="r")
        await anext(stream)
        abort = asyncio.ensure_future(engine.abort("r"))
        await asyncio.sleep(0)          # the command is posted
        abort.cancel()
        for _ in range(200):
            if (await engine.stats()).num_running == 0:
                break
            await asyncio.sleep(0.01)
        assert (await engine.stats()).num_running == 0
        out = [o async for o in engine.generate("again", SamplingParams(max_tokens=3))]
        assert out[-1].finished and engine.error is None
    finally:
        engine.shutdown()
