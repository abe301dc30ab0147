"""A replica's ``Link`` stream: the router sends every request (and abort) on it as a message,
with no call per request; the replica answers each with its admission, then its chunks. A
replica whose engine cannot take a request has it placed on another; a router can stand in
front of routers (it serves ``Link`` too)."""
from __future__ import annotations

import asyncio
import time
from collections import Counter

import grpc

from lenserve.client import AsyncClient
from lenserve_contract.proto import common_pb2, scheduler_pb2, scheduler_pb2_grpc
from services import rpc
from services.scheduler import convert
from services.scheduler.load import ReplicaLoad
from services.scheduler.scheduler import SchedulerStats
from services.scheduler.servicer import SchedulerServicer
from tests.router.test_router_service import BOUND_S, Replica, run, start_router


async def test_a_routed_request_costs_the_replica_no_call_of_its_own(monkeypatch):
    calls: Counter = Counter()
    submit, link = SchedulerServicer.Submit, SchedulerServicer.Link

    async def counted_submit(self, request, context):
        calls["Submit"] += 1
        return await submit(self, request, context)

    async def counted_link(self, request_iterator, context):
        calls["Link"] += 1
        async for reply in link(self, request_iterator, context):
            yield reply
    monkeypatch.setattr(SchedulerServicer, "Submit", counted_submit)
    monkeypatch.setattr(SchedulerServicer, "Link", counted_link)
    replica = await Replica().start()
    router, server, target = await start_router([replica])
    clients = [AsyncClient(target), AsyncClient(target, multiplex=True)]
    try:
        for client in clients:
            results = await asyncio.gather(*(run(client, f"p{i}", 3) for i in range(4)))
            assert all(len(tokens) == 3 for tokens, _ in results)
        # Eight requests placed, each one message on the replica's one open stream.
        assert calls == {"Link": 1}
    finally:
        for client in clients:
            await client.close()
        await server.stop(grace=None)
        await router.close()
        await replica.stop()


def _request(rid: str, prompt: str, max_tokens: int = 3) -> scheduler_pb2.LinkRequest:
    msg = convert.request_to_pb(rid, prompt, None, None)
    msg.sampling_params.max_tokens, msg.sampling_params.ignore_eos = max_tokens, True
    return scheduler_pb2.LinkRequest(submit=msg)


async def test_the_replica_admits_refuses_and_aborts_on_its_link():
    replica = await Replica(step_s=0.01).start()
    outbox: asyncio.Queue = asyncio.Queue()

    async def requests():
        while True:
            yield await outbox.get()
    try:
        async with grpc.aio.insecure_channel(replica.target) as channel:
            link = scheduler_pb2_grpc.SchedulerServiceStub(channel).Link(requests())
            for msg in (_request("ok", "hello"), _request("bad", ""),
                        _request("long", "hello", 100)):
                outbox.put_nowait(msg)
            admissions, finished = {}, {}
            while len(finished) < 2:
                reply = await asyncio.wait_for(link.read(), BOUND_S)
                admissions.update({a.request_id: a for a in reply.admissions})
                finished.update({c.request_id: c.finish_reason for c in reply.chunks
                                 if c.finished})
                if "long" in admissions and len(finished) == 1:
                    outbox.put_nowait(scheduler_pb2.LinkRequest(abort="long"))
            link.cancel()
        assert not admissions["ok"].HasField("error") and not admissions["long"].HasField("error")
        bad = admissions["bad"].error
        assert bad.code == common_pb2.ERROR_CODE_INVALID_ARGUMENT and bad.field == "prompt"
        assert finished == {"ok": common_pb2.FINISH_REASON_LENGTH,
                            "long": common_pb2.FINISH_REASON_ABORT}
    finally:
        await replica.stop()


class _Stopped(scheduler_pb2_grpc.SchedulerServiceServicer):
    """A replica that reports load but whose engine has stopped: it takes nothing."""

    async def Link(self, request_iterator, context):
        await context.send_initial_metadata(())
        async for msg in request_iterator:
            yield scheduler_pb2.LinkReply(admissions=[scheduler_pb2.Admission(
                request_id=msg.submit.request_id, error=common_pb2.ErrorDetail(
                    code=common_pb2.ERROR_CODE_UNAVAILABLE, message="engine stopped"))])

    async def StreamLoad(self, request, context):
        stats = SchedulerStats("stopped", 0, 0, 0, 64, 64, 0, 0, 0)
        while True:
            yield convert.load_to_pb(ReplicaLoad(stats, 4, 0, 0, 0))
            await asyncio.sleep(0.02)


async def test_a_request_a_replica_cannot_take_is_placed_on_another():
    stopped, fake = await _stopped_replica()
    good = await Replica().start()
    router, server, target = await start_router([fake, good], policy="round-robin")
    client = AsyncClient(target, multiplex=True)
    try:
        results = await asyncio.gather(*(run(client, f"p{i}", 3) for i in range(4)))
        assert all(len(tokens) == 3 for tokens, _ in results)
        assert router.num_submit_failures >= 1       # round-robin sent some to the stopped one
        assert router.core.replicas[good.target].num_placed == 4
        assert router.core.replicas[fake.target].num_placed == router.num_submit_failures
    finally:
        await client.close()
        await server.stop(grace=None)
        await router.close()
        await stopped.stop(grace=None)
        await good.stop()


async def _stopped_replica():
    server, port = rpc.new_server("127.0.0.1:0", "stopped replica")
    scheduler_pb2_grpc.add_SchedulerServiceServicer_to_server(_Stopped(), server)
    await server.start()

    class Stopped:
        target = f"127.0.0.1:{port}"
    return server, Stopped()


async def test_a_request_no_replica_can_take_ends_within_its_hold():
    stopped, replica = await _stopped_replica()
    router, server, target = await start_router([replica], hold_s=0.3)
    client = AsyncClient(target, retries=0)
    try:
        began = time.monotonic()
        tokens, last = await asyncio.wait_for(run(client, "hello", 3), BOUND_S)
        assert not tokens and last.outputs[0].finish_reason == "error"
        assert "could not take" in last.error
        # Sent again after a pause each time, not in a loop as fast as the refusals come.
        assert router.num_submit_failures <= (time.monotonic() - began) / 0.02 + 1
        assert not router.sinks and not router.core.requests
    finally:
        await client.close()
        await server.stop(grace=None)
        await router.close()
        await stopped.stop(grace=None)


async def test_a_router_in_front_of_a_router_serves_as_a_replica():
    replica = await Replica().start()
    inner, inner_server, inner_target = await start_router([replica])

    class Inner:
        target = inner_target
    outer, outer_server, outer_target = await start_router([Inner()])
    direct, routed = AsyncClient(replica.target), AsyncClient(outer_target)
    try:
        want, _ = await run(direct, "same", 5)
        got, last = await run(routed, "same", 5)
        assert got == want and last.outputs[0].finish_reason == "length"
        assert inner.core.replicas[replica.target].num_placed == 1
    finally:
        for client in (direct, routed):
            await client.close()
        for server, router in ((outer_server, outer), (inner_server, inner)):
            await server.stop(grace=None)
            await router.close()
        await replica.stop()


class _Older(scheduler_pb2_grpc.SchedulerServiceServicer):
    """A replica of a lenserve before ``Link``: it reports load, and ``Link`` is
    ``UNIMPLEMENTED`` (the generated base class's answer)."""

    StreamLoad = _Stopped.StreamLoad


async def test_a_replica_without_link_gets_no_request_and_is_named_once(caplog):
    server, port = rpc.new_server("127.0.0.1:0", "older replica")
    scheduler_pb2_grpc.add_SchedulerServiceServicer_to_server(_Older(), server)
    await server.start()

    class Older:
        target = f"127.0.0.1:{port}"
    good = await Replica().start()
    router, front, target = await start_router([Older(), good], policy="round-robin",
                                               expect_up=1)
    client = AsyncClient(target, multiplex=True)
    try:
        with caplog.at_level("ERROR", logger="services.router.replicas"):
            await asyncio.sleep(0.5)        # several reconnection attempts
            results = await asyncio.gather(*(run(client, f"p{i}", 3) for i in range(6)))
        assert all(len(tokens) == 3 for tokens, _ in results)
        assert router.num_submit_failures == 0
        assert router.core.replicas[Older.target].num_placed == 0
        assert not router.links[Older.target].connected
        named = [r for r in caplog.records if "serves no Link" in r.getMessage()]
        assert len(named) == 1 and Older.target in named[0].getMessage()
    finally:
        await client.close()
        await front.stop(grace=None)
        await router.close()
        await server.stop(grace=None)
        await good.stop()
