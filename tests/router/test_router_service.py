"""The router over real scheduler replicas (in-process grpc.aio servers, fake model): the
gateway's client talks to it unchanged; a replica that fails has its unstarted requests placed
elsewhere and its started ones ended with an error; a returning replica takes requests again;
no request is held past its deadline."""
from __future__ import annotations

import asyncio
import time

import grpc
import pytest

from lenserve.client import AsyncClient
from lenserve_contract.errors import InvalidRequestError
from lenserve_contract.sampling_params import SamplingParams
from services.router.core import RouterCore
from services.router.runtime import Router
from services.router.servicer import build_server as build_router_server
from services.router.servicer import mark_serving as router_serving
from services.scheduler.async_engine import AsyncEngine
from services.scheduler.servicer import build_server, mark_serving
from services.scheduler.wiring import EngineConfig

BOUND_S = 20        # no test waits longer than this for anything (a bound, not a timing)


def replica_config(max_num_seqs: int = 8) -> EngineConfig:
    return EngineConfig(model="fake", block_size=4, num_gpu_blocks=64, max_model_len=128,
                        max_num_seqs=max_num_seqs)


class Replica:
    """A scheduler service on a fixed port, stoppable and restartable."""

    def __init__(self, port: int = 0, max_num_seqs: int = 8, step_s: float = 0.002):
        self.port, self.max_num_seqs, self.step_s = port, max_num_seqs, step_s
        self.engine = self.server = None

    async def start(self) -> Replica:
        self.engine = AsyncEngine(replica_config(self.max_num_seqs))
        execute, step_s = self.engine.engine.executor.execute, self.step_s

        def slow_execute(batch):        # iterations long enough for a fault to land mid-way
            time.sleep(step_s)
            return execute(batch)

        self.engine.engine.executor.execute = slow_execute
        self.server, self.port = build_server(self.engine, f"127.0.0.1:{self.port}")
        await self.server.start()
        await mark_serving(self.server)
        return self

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def stop(self) -> None:
        await self.server.stop(grace=None)
        self.engine.shutdown()


async def start_router(replicas: list[Replica], policy: str = "round-robin",
                       hold_s: float = 5.0, expect_up: int | None = None):
    router = Router(RouterCore(policy), hold_s=hold_s, load_interval_s=0.02)
    server, port = build_router_server(router, "127.0.0.1:0")
    await server.start()
    await router_serving(server)
    router.set_replicas([r.target for r in replicas])
    up = len(replicas) if expect_up is None else expect_up
    await until(lambda: len(router.core.up_replicas()) == up)
    return router, server, f"127.0.0.1:{port}"


async def until(condition, bound_s: float = BOUND_S) -> None:
    deadline = time.monotonic() + bound_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met within the bound"
        await asyncio.sleep(0.01)


async def run(client, prompt: str, max_tokens: int, request_id=None):
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0)
    tokens, last = [], None
    async for out in client.generate(prompt, params, request_id):
        tokens += out.outputs[0].token_ids
        last = out
    return tokens, last


@pytest.fixture
async def cluster():
    replicas = [await Replica().start() for _ in range(2)]
    router, server, target = await start_router(replicas)
    yield replicas, router, target
    await server.stop(grace=None)
    await router.close()
    for r in replicas:
        await r.stop()


@pytest.mark.parametrize("multiplex", [False, True])
async def test_the_router_serves_the_scheduler_contract_as_a_replica_does(cluster, multiplex):
    replicas, router, target = cluster
    direct = AsyncClient(replicas[0].target)
    routed = AsyncClient(target, multiplex=multiplex)
    try:
        want = await run(direct, "the same prompt", 6)
        got = await asyncio.gather(*(run(routed, "the same prompt", 6) for _ in range(4)))
        assert all(tokens == want[0] for tokens, _ in got)
        assert all(last.outputs[0].finish_reason == "length" for _, last in got)
        assert sorted(v.num_placed for v in router.core.replicas.values()) == [2, 2]
        with pytest.raises(InvalidRequestError) as bad:      # the replica's refusal, relayed
            await run(routed, "", 4)
        assert bad.value.field == "prompt"
        stats = await routed.stats()
        assert stats.policy == "router:round-robin" and stats.num_total_blocks == 128
    finally:
        await direct.close()
        await routed.close()


async def test_a_failed_replica_drains_unstarted_requests_elsewhere_and_errors_started_ones():
    # Replica a runs one request at a time, slowly: one starts, the rest wait there.
    a = await Replica(max_num_seqs=1, step_s=0.02).start()
    b = await Replica().start()
    router, server, target = await start_router([a, b], policy="round-robin")
    client = AsyncClient(target, multiplex=True)
    try:
        tasks = [asyncio.ensure_future(run(client, f"prompt {i}", 40, f"r{i}"))
                 for i in range(6)]
        await until(lambda: router.core.requests.get("r0") is not None
                    and router.core.requests["r0"].started)
        on_a = {rid for rid, p in router.core.requests.items() if p.replica == a.target}
        started = {rid for rid in on_a if router.core.requests[rid].started}
        await a.stop()
        results = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True),
                                         BOUND_S)
        by_id = {f"r{i}": res for i, res in enumerate(results)}
        for rid in started:                 # a clear error, not a hang
            tokens, last = by_id[rid]
            assert last.outputs[0].finish_reason == "error" and "failed after" in last.error
        for rid in on_a - started:          # placed again on b, finished in full
            tokens, last = by_id[rid]
            assert len(tokens) == 40 and last.outputs[0].finish_reason == "length"
        assert on_a - started, "the scenario must leave requests waiting on the failed replica"
        assert router.core.num_replaced == len(on_a - started)
        assert not router.core.replicas[a.target].up

        a2 = await Replica(port=a.port).start()     # it returns on the same address
        await until(lambda: router.core.replicas[a.target].up)
        before = router.core.replicas[a.target].num_placed
        await asyncio.gather(*(run(client, "again", 4) for _ in range(4)))
        assert router.core.replicas[a.target].num_placed > before
        await a2.stop()
    finally:
        await client.close()
        await server.stop(grace=None)
        await router.close()
        await b.stop()


@pytest.mark.parametrize("multiplex", [False, True])
async def test_no_request_is_held_past_its_deadline_when_no_replica_is_up(multiplex):
    a = await Replica().start()
    router, server, target = await start_router([a], hold_s=60)
    await a.stop()
    await until(lambda: not router.core.up_replicas())
    client = AsyncClient(target, retries=0, multiplex=multiplex)
    try:
        began = time.monotonic()
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await asyncio.wait_for(run_with_deadline(client, 0.5), BOUND_S)
        assert err.value.code() in (grpc.StatusCode.DEADLINE_EXCEEDED,
                                    grpc.StatusCode.UNAVAILABLE)
        assert time.monotonic() - began < 60        # ended by its deadline, not the hold
        await until(lambda: not router.sinks and not router.core.requests)  # nothing kept
    finally:
        await client.close()
        await server.stop(grace=None)
        await router.close()


async def run_with_deadline(client, timeout_s: float):
    params = SamplingParams(max_tokens=4, ignore_eos=True)
    async for _ in client.generate("hello", params, timeout_s=timeout_s):
        pass
