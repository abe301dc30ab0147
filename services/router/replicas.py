"""One scheduler replica as the router holds it: a channel, the replica's ``Subscribe``
stream (every request the router placed there comes back on it, one message per iteration),
and its ``StreamLoad`` reports. Both are opened together and watched together: when either
ends, the replica is lost (``on_lost``), and the link tries again with backoff until the
replica answers, which puts it back in rotation (its first load report marks it up)."""
from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable

import grpc

from lenserve_contract.proto import scheduler_pb2, scheduler_pb2_grpc
from services import rpc
from services.scheduler import convert

log = logging.getLogger(__name__)


class ReplicaLink:
    def __init__(self, name: str, on_load: Callable, on_chunks: Callable,
                 on_lost: Callable, *, load_interval_s: float = 0.1,
                 backoff_s: float = 0.2, max_backoff_s: float = 2.0):
        self.name = name
        self.on_load, self.on_chunks, self.on_lost = on_load, on_chunks, on_lost
        self.load_interval_s = load_interval_s
        self.backoff_s, self.max_backoff_s = backoff_s, max_backoff_s
        self._channel = grpc.aio.insecure_channel(rpc.strip_scheme(name),
                                                  options=rpc.CHANNEL_OPTIONS)
        self._stub = scheduler_pb2_grpc.SchedulerServiceStub(self._channel)
        self.subscriber_id = ""
        self.connected = False
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self._channel.close()

    async def submit(self, request: scheduler_pb2.Request, timeout_s: float) -> None:
        """Send one request on the open subscription (raises ``grpc.aio.AioRpcError``)."""
        msg = scheduler_pb2.SubmitRequest(subscriber_id=self.subscriber_id, request=request)
        await self._stub.Submit(msg, timeout=timeout_s)

    async def abort(self, request_id: str, timeout_s: float = 5.0) -> bool:
        try:
            resp = await self._stub.Abort(scheduler_pb2.AbortRequest(request_id=request_id),
                                          timeout=timeout_s)
        except grpc.aio.AioRpcError:
            return False        # the replica is gone: nothing left to abort there
        return resp.found

    async def _run(self) -> None:
        delay = self.backoff_s
        while True:
            try:
                await self._session()
                delay = self.backoff_s
            except grpc.aio.AioRpcError as err:
                log.warning("replica %s lost: %s", self.name, err.details() or err.code())
            except ConnectionError as err:
                log.warning("replica %s lost: %s", self.name, err)
            if self.connected:
                self.connected = False
                self.on_lost(self.name)
            else:
                delay = min(delay * 2, self.max_backoff_s)
            await asyncio.sleep(delay)

    async def _session(self) -> None:
        """Subscribe, then stream load reports; return or raise when either ends."""
        subscriber_id = f"router-{uuid.uuid4().hex}"
        sub = self._stub.Subscribe(scheduler_pb2.SubscribeRequest(subscriber_id=subscriber_id))
        loads = self._stub.StreamLoad(scheduler_pb2.LoadRequest(interval_s=self.load_interval_s))
        readers: list[asyncio.Future] = []
        try:
            if await sub.read() is grpc.aio.EOF:   # the empty message that says it is open
                raise ConnectionError("the replica closed its subscription")
            self.subscriber_id = subscriber_id
            first = await loads.read()
            if first is grpc.aio.EOF:
                raise ConnectionError("the replica closed its load stream")
            self.connected = True
            self.on_load(self.name, convert.load_from_pb(first))
            readers = [asyncio.ensure_future(self._read_chunks(sub)),
                       asyncio.ensure_future(self._read_loads(loads))]
            done, _ = await asyncio.wait(readers, return_when=asyncio.FIRST_COMPLETED)
            errors = [t.exception() for t in done]      # both may have failed at once
            raise next((e for e in errors if e is not None),
                       ConnectionError("the replica ended its streams"))
        finally:
            for task in readers:
                task.cancel()
            # Collected, so that a stream's error never goes unretrieved.
            await asyncio.gather(*readers, return_exceptions=True)
            sub.cancel()
            loads.cancel()

    async def _read_chunks(self, sub) -> None:
        while (step := await sub.read()) is not grpc.aio.EOF:
            if step.chunks:
                self.on_chunks(self.name, step.chunks)

    async def _read_loads(self, loads) -> None:
        while (msg := await loads.read()) is not grpc.aio.EOF:
            self.on_load(self.name, convert.load_from_pb(msg))
