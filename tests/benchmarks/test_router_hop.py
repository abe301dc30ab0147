"""The router-hop benchmark's stub replica answers on its ``Link`` as on ``Generate``: the
first chunk at once, so that routed minus direct is the router's cost, not the stub's."""
from __future__ import annotations

import asyncio

import grpc

from benchmarks.router_hop import PROMPT, TOKENS, StubReplica
from lenserve_contract.proto import common_pb2, scheduler_pb2, scheduler_pb2_grpc
from services import rpc


async def test_the_stub_sends_an_admission_with_its_first_chunk_and_then_the_rest():
    server, port = rpc.new_server("127.0.0.1:0", "stub replica")
    scheduler_pb2_grpc.add_SchedulerServiceServicer_to_server(StubReplica(), server)
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            outbox: asyncio.Queue = asyncio.Queue()

            async def requests():
                while (msg := await outbox.get()) is not None:
                    yield msg
            link = scheduler_pb2_grpc.SchedulerServiceStub(channel).Link(requests())
            await asyncio.wait_for(link.initial_metadata(), 10)
            request = common_pb2.Request(request_id="r0", prompt_token_ids=PROMPT)
            outbox.put_nowait(scheduler_pb2.LinkRequest(submit=request))
            first = await asyncio.wait_for(link.read(), 10)
            # One reply: the admission and the first token together (a stub that computes
            # nothing has both at once; the admission alone ahead of it was the stub's cost).
            assert [a.request_id for a in first.admissions] == ["r0"]
            assert [c.num_output_tokens for c in first.chunks] == [1]
            tokens = 1
            while tokens < TOKENS:
                reply = await asyncio.wait_for(link.read(), 10)
                tokens += sum(len(c.token_ids) for c in reply.chunks)
            assert tokens == TOKENS and reply.chunks[-1].finished
            outbox.put_nowait(None)
            link.cancel()
    finally:
        await server.stop(grace=None)


def test_placement_timing_places_and_finishes_on_every_kind_of_replica(capsys):
    from benchmarks.router_hop import main, time_placements
    assert time_placements("length-aware", True, replicas=2, per_replica=5, num=30) > 0
    assert main(["place", "--replicas", "2", "--requests", "5"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 4 and all("us per finish + placement" in line for line in lines)
