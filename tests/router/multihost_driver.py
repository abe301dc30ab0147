"""Load for the multi-host test, run inside the front network namespace: N streaming requests
through the router, one replica's scheduler killed (SIGKILL) once the first request finished,
then one completion through the gateway. Prints one JSON line: per request the tokens it got
and how it ended."""
from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time

from lenserve.client import AsyncClient
from lenserve_contract.sampling_params import SamplingParams

BOUND_S = 240


async def one(client, i: int, first_done: asyncio.Event) -> dict:
    tokens, reason, error = 0, None, None
    try:
        params = SamplingParams(max_tokens=24, ignore_eos=True, temperature=0)
        async for out in client.generate(f"request {i} about the sea", params, f"m{i}"):
            tokens += len(out.outputs[0].token_ids)
            reason, error = out.outputs[0].finish_reason, out.error
    except Exception as exc:  # noqa: BLE001 - every way a request can end is recorded
        reason, error = "raised", f"{type(exc).__name__}: {exc}"
    first_done.set()
    return {"id": i, "tokens": tokens, "finish_reason": reason, "error": error}


async def until_served(client) -> None:
    deadline = time.monotonic() + BOUND_S
    while True:
        try:
            async for _ in client.generate("warm up", SamplingParams(max_tokens=2)):
                pass
            stats = await client.stats()
            if stats.num_total_blocks and stats.policy.startswith("router:"):
                return
        except Exception:  # noqa: BLE001 - replicas still starting
            pass
        if time.monotonic() > deadline:
            raise SystemExit("the router never served")
        await asyncio.sleep(1)


async def main(router: str, kill_pid: int, gateway: str, n: int) -> None:
    async with AsyncClient(router, multiplex=True) as client:
        await until_served(client)
        first_done = asyncio.Event()
        tasks = [asyncio.ensure_future(one(client, i, first_done)) for i in range(n)]
        await asyncio.wait_for(first_done.wait(), BOUND_S)
        os.kill(kill_pid, signal.SIGKILL)
        results = await asyncio.wait_for(asyncio.gather(*tasks), BOUND_S)
    import httpx
    body = {"model": "opt-tiny", "prompt": "After the kill", "max_tokens": 4}
    resp = httpx.post(f"{gateway}/v1/completions", json=body, timeout=60)
    print(json.dumps({"requests": results, "gateway_status": resp.status_code}), flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])))
