"""The router hop in isolation, for ``benchmarks/router.py``: one stub replica that answers at
once on the scheduler's contract (``Generate``, ``Subscribe``/``Submit``, ``Link``, ``StreamLoad``:
``TOKENS`` one-token chunks per request, ``STEP_S`` apart, no model, no queue), and one router
(its default policy, ``length-aware``) in front of it, each its own process. The client sends
the same request straight to the stub and through the router, alternating request by request,
one at a time, and records the time to the first token and to the last; the hop's cost is the routed
time minus the direct time of each pair. The router logs its placement counter when it stops
(the time inside ``RouterCore.place``), which is read back from its log.

    python3 -m benchmarks.router_hop stub --port PORT      # the stub replica alone
    python3 -m benchmarks.router_hop place [--replicas 16 --requests 150]

``place`` times the router core alone, in this process: a request finishing and another
being placed, over replicas that each hold ``--requests`` of this router's placements, each
replica reporting its load every 20 placements; per policy and kind of replica (one that
serves in arrival order, one that preempts by predicted length).
"""
from __future__ import annotations

import argparse
import asyncio
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks.stamp import REPO
from lenserve_contract.proto import common_pb2, scheduler_pb2, scheduler_pb2_grpc
from services import rpc
from services.scheduler import convert
from services.scheduler.load import ReplicaLoad
from services.scheduler.scheduler import SchedulerStats

TOKENS = 8
STEP_S = 0.002                      # between the stub's tokens: a fast decode step
PROMPT = list(range(100, 132))      # 32 prompt tokens (two blocks of 16)
_STATS = SchedulerStats("stub", 0, 0, 0, 4096, 4096, 0, 0, 0)


def _chunks(request: common_pb2.Request):
    for i in range(TOKENS):
        done = i == TOKENS - 1
        yield common_pb2.TokenChunk(
            request_id=request.request_id, token_ids=[7], finished=done,
            finish_reason=common_pb2.FINISH_REASON_LENGTH if done else 0,
            num_prompt_tokens=len(request.prompt_token_ids), num_output_tokens=i + 1)


async def _paced(request: common_pb2.Request):
    """The first chunk at once, the next ones ``STEP_S`` apart (as iterations follow)."""
    for i, chunk in enumerate(_chunks(request)):
        if i:
            await asyncio.sleep(STEP_S)
        yield chunk


class StubReplica(scheduler_pb2_grpc.SchedulerServiceServicer):
    """Answers every request at once: ``TOKENS`` chunks, one per message, ``STEP_S`` apart."""

    def __init__(self):
        self.subs: dict[str, asyncio.Queue] = {}

    async def Generate(self, request, context):
        async for chunk in _paced(request):
            yield chunk

    async def Subscribe(self, request, context):
        queue = self.subs[request.subscriber_id] = asyncio.Queue()
        try:
            yield scheduler_pb2.StepChunks()
            while True:
                yield scheduler_pb2.StepChunks(chunks=[await queue.get()])
        finally:
            del self.subs[request.subscriber_id]

    async def Submit(self, request, context):
        self._answer(self.subs[request.subscriber_id], request.request)
        return scheduler_pb2.SubmitResponse()

    @classmethod
    def _answer(cls, queue: asyncio.Queue, request: common_pb2.Request) -> None:
        """The first chunk into ``queue`` at once, as ``Generate`` answers, the rest paced."""
        chunks = _chunks(request)
        queue.put_nowait(next(chunks))
        asyncio.ensure_future(cls._feed(queue, chunks))

    @staticmethod
    async def _feed(queue: asyncio.Queue, chunks) -> None:
        for chunk in chunks:
            await asyncio.sleep(STEP_S)
            queue.put_nowait(chunk)

    async def Link(self, request_iterator, context):
        await context.send_initial_metadata(())     # the router waits for it
        queue: asyncio.Queue = asyncio.Queue()
        reader = asyncio.ensure_future(self._take(request_iterator, queue))
        try:
            while True:
                items = [await queue.get()]
                while not queue.empty():        # as a replica sends what is ready at once
                    items.append(queue.get_nowait())
                reply = scheduler_pb2.LinkReply()
                for item in items:
                    if isinstance(item, scheduler_pb2.Admission):
                        reply.admissions.append(item)
                    else:
                        reply.chunks.append(item)
                yield reply
        finally:
            reader.cancel()

    async def _take(self, request_iterator, queue: asyncio.Queue) -> None:
        async for msg in request_iterator:
            if msg.HasField("submit"):
                rid = msg.submit.request_id
                queue.put_nowait(scheduler_pb2.Admission(request_id=rid))
                # Its first chunk is ready as it is admitted (this stub computes nothing), so
                # both go in one reply, as a replica sends what is ready at once. A replica's
                # first token comes a prefill after its admission, which goes out meanwhile;
                # answered one after the other, the admission's write sat ahead of the first
                # chunk here and added about 0.3-0.4 ms that no real replica adds.
                self._answer(queue, msg.submit)

    async def Abort(self, request, context):
        return scheduler_pb2.AbortResponse(found=False)

    async def GetStats(self, request, context):
        return convert.stats_to_pb(_STATS)

    async def StreamLoad(self, request, context):
        while True:
            yield convert.load_to_pb(ReplicaLoad(_STATS, 16, 0, 0))
            await asyncio.sleep(max(request.interval_s, 0.01))


async def _serve_stub(port: int) -> None:
    server, _ = rpc.new_server(f"127.0.0.1:{port}", "stub replica")
    scheduler_pb2_grpc.add_SchedulerServiceServicer_to_server(StubReplica(), server)
    await server.start()
    await rpc.mark_serving(server, ["lenserve.proto.SchedulerService"])
    await rpc.wait_for_signal()
    await server.stop(grace=1)


async def _one(stub, rid: str) -> tuple[float, float]:
    """(time to first token, time to the last), seconds."""
    request = common_pb2.Request(request_id=rid, prompt_token_ids=PROMPT)
    request.sampling_params.max_tokens = TOKENS
    t0, first = time.perf_counter(), None
    async for chunk in stub.Generate(request, timeout=10):
        if first is None and chunk.token_ids:
            first = time.perf_counter() - t0
    return first, time.perf_counter() - t0


async def _pairs(direct: str, routed: str, num: int, warmup: int) -> dict[str, np.ndarray]:
    import grpc
    async with grpc.aio.insecure_channel(direct) as dc, grpc.aio.insecure_channel(routed) as rc:
        stubs = {"direct": scheduler_pb2_grpc.SchedulerServiceStub(dc),
                 "routed": scheduler_pb2_grpc.SchedulerServiceStub(rc)}
        got: dict[str, list] = {k: [] for k in stubs}
        for i in range(num + warmup):
            # Alternate which side goes first, so neither always follows the other.
            for side in (("direct", "routed") if i % 2 else ("routed", "direct")):
                t = await _one(stubs[side], f"hop-{side}-{i}")
                if i >= warmup:
                    got[side].append(t)
    return {k: np.array(v) for k, v in got.items()}


def _pcts(values: np.ndarray) -> dict[str, float]:
    return {f"p{q}": float(np.percentile(values, q)) * 1000 for q in (50, 90, 99)}


def measure(raw: Path, num: int = 500, warmup: int = 20) -> dict:
    """Start the stub and a router, run ``num`` interleaved pairs, stop both."""
    from lenserve.commands.up import free_port
    from services.rpc import check_health
    raw.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    stub_port, router_port = free_port("127.0.0.1"), free_port("127.0.0.1")
    procs = {}
    for name, argv in (("stub", ["benchmarks.router_hop", "stub", "--port", str(stub_port)]),
                       ("router", ["services.router", "--replicas", f"127.0.0.1:{stub_port}",
                                   "--port", str(router_port)])):
        log = open(raw / f"hop_{name}.log", "w")       # noqa: SIM115 - closed with the process
        procs[name] = subprocess.Popen([sys.executable, "-m", *argv], cwd=REPO, env=env,
                                       stdout=log, stderr=subprocess.STDOUT)
    direct, routed = f"127.0.0.1:{stub_port}", f"127.0.0.1:{router_port}"
    try:
        deadline = time.monotonic() + 120
        for target in (direct, routed):
            while not check_health(target):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{target} did not start; see {raw}/hop_*.log")
                time.sleep(0.2)
        time.sleep(0.5)     # the router's first load report from the stub
        got = asyncio.run(_pairs(direct, routed, num, warmup))
    finally:
        for proc in procs.values():
            proc.terminate()
        for proc in procs.values():
            proc.wait(timeout=30)
    placed = re.search(r"placed (\d+) requests, ([\d.]+) us per placement",
                       (raw / "hop_router.log").read_text())
    d, r = got["direct"], got["routed"]
    return {"num": num, "load_avg": os.getloadavg()[0],
            "direct_ttft_ms": _pcts(d[:, 0]), "routed_ttft_ms": _pcts(r[:, 0]),
            "added_ttft_ms": _pcts(r[:, 0] - d[:, 0]),
            "added_e2e_ms": _pcts(r[:, 1] - d[:, 1]),
            "placements": int(placed[1]) if placed else None,
            "place_us_mean": float(placed[2]) if placed else None}


def time_placements(policy: str, preempts: bool, replicas: int = 16, per_replica: int = 150,
                    num: int = 5000, report_every: int = 20) -> float:
    """Microseconds per finish + placement in ``RouterCore`` (``place``'s docstring above)."""
    import random

    from services.router.core import Placement, RouterCore
    rng = random.Random(0)
    core = RouterCore(policy)
    for i in range(replicas):
        core.add_replica(f"r{i}")

    def report():
        for name, view in core.replicas.items():
            n = len(view.placed)
            stats = SchedulerStats("sim", min(5, n), max(n - 5, 0), 0, 100, 1536, 10, 0, 0)
            core.on_load(name, ReplicaLoad(stats, 16, 500, 150 * n, 0,
                                           (4.65e-5, 1.72e-6, 0.0118), False, preempts))

    def placement(rid: str):
        return Placement(rid, rng.randint(20, 800), rng.randint(5, 800))
    report()
    for i in range(replicas * per_replica):
        core.place(placement(f"held-{i}"))
    ids = list(core.requests)
    t0 = time.perf_counter()
    for i in range(num):
        if i % report_every == 0:
            report()
        core.on_finished(ids.pop(rng.randrange(len(ids))))
        core.place(placement(f"new-{i}"))
        ids.append(f"new-{i}")
        core.on_tokens(rng.choice(ids), 1)
    return (time.perf_counter() - t0) / num * 1e6


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m benchmarks.router_hop")
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("stub").add_argument("--port", type=int, required=True)
    m = sub.add_parser("measure")
    m.add_argument("--num", type=int, default=500)
    m.add_argument("--raw", type=Path, default=Path("results/raw/router_hop"))
    pl = sub.add_parser("place")
    pl.add_argument("--replicas", type=int, default=16)
    pl.add_argument("--requests", type=int, default=150, help="held by each replica")
    args = ap.parse_args(argv)
    if args.cmd == "stub":
        asyncio.run(_serve_stub(args.port))
    elif args.cmd == "place":
        for policy in ("least-loaded", "length-aware"):
            for preempts in (False, True):
                us = time_placements(policy, preempts, args.replicas, args.requests)
                print(f"{policy:13s} {'preempting' if preempts else 'in arrival order':17s} "
                      f"{us:6.0f} us per finish + placement")
    else:
        print(measure(args.raw, args.num))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
