"""One scheduler replica as the router holds it: a channel, one ``Link`` stream (every request
the router places there goes up it as a message, and every iteration's chunks of them, and
each request's admission, come back on it) and its ``StreamLoad`` reports. Both are opened
together and watched together: when either ends, the replica is lost (``on_lost``), and the
link tries again with backoff until the replica answers, which puts it back in rotation (its
first load report marks it up).

A request costs the link one message on a stream that is already open, not a call of its own
(a unary ``Submit`` per request opened an HTTP/2 stream and waited a round trip before the
request's first token could come back).

A replica that serves ``Link`` sends its initial metadata as the stream opens; the link waits
for it before the replica counts as up, so a replica of an older lenserve (no ``Link``:
``UNIMPLEMENTED``) is never placed on, and says so once in the log, instead of taking requests
that then fail over."""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import grpc

from lenserve_contract.proto import scheduler_pb2, scheduler_pb2_grpc
from services import rpc
from services.scheduler import convert

log = logging.getLogger(__name__)


class NoLink(ConnectionError):
    """The replica does not serve ``Link``: an older lenserve than the router."""


class ReplicaLink:
    def __init__(self, name: str, on_load: Callable, on_reply: Callable,
                 on_lost: Callable, *, load_interval_s: float = 0.1,
                 backoff_s: float = 0.2, max_backoff_s: float = 2.0):
        self.name = name
        self.on_load, self.on_reply, self.on_lost = on_load, on_reply, on_lost
        self.load_interval_s = load_interval_s
        self.backoff_s, self.max_backoff_s = backoff_s, max_backoff_s
        self._channel = grpc.aio.insecure_channel(rpc.strip_scheme(name),
                                                  options=rpc.CHANNEL_OPTIONS)
        self._stub = scheduler_pb2_grpc.SchedulerServiceStub(self._channel)
        self.connected = False
        self.no_link_logged = False
        self._outbox: asyncio.Queue | None = None      # the open stream's; None between them
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self._channel.close()

    def send(self, msg: scheduler_pb2.LinkRequest) -> bool:
        """Queue one message on the open stream; False when none is open (the replica is being
        lost: what it held is placed again or failed by ``on_lost``)."""
        if self._outbox is None:
            return False
        self._outbox.put_nowait(msg)
        return True

    def submit(self, request) -> bool:
        return self.send(scheduler_pb2.LinkRequest(submit=request))

    def abort(self, request_id: str) -> bool:
        return self.send(scheduler_pb2.LinkRequest(abort=request_id))

    async def _run(self) -> None:
        delay = self.backoff_s
        while True:
            try:
                await self._session()
                delay = self.backoff_s
            except NoLink as err:
                if not self.no_link_logged:
                    log.error("replica %s: %s", self.name, err)
                    self.no_link_logged = True
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
        """Open the link, then stream load reports; return or raise when either ends."""
        outbox: asyncio.Queue = asyncio.Queue()
        link = self._stub.Link(_drain(outbox))
        loads = self._stub.StreamLoad(scheduler_pb2.LoadRequest(interval_s=self.load_interval_s))
        readers: list[asyncio.Future] = []
        try:
            await link.initial_metadata()       # sent at once by a replica that serves Link
            if link.done() and await link.code() == grpc.StatusCode.UNIMPLEMENTED:
                raise NoLink("it serves no Link stream (an older lenserve than the router's); "
                             "it gets no requests until it is upgraded")
            first = await loads.read()
            if first is grpc.aio.EOF:
                raise ConnectionError("the replica closed its load stream")
            self.connected, self._outbox = True, outbox
            self.on_load(self.name, convert.load_from_pb(first))
            readers = [asyncio.ensure_future(self._read_replies(link)),
                       asyncio.ensure_future(self._read_loads(loads))]
            done, _ = await asyncio.wait(readers, return_when=asyncio.FIRST_COMPLETED)
            errors = [t.exception() for t in done]      # both may have failed at once
            raise next((e for e in errors if e is not None),
                       ConnectionError("the replica ended its streams"))
        finally:
            self._outbox = None
            outbox.put_nowait(None)     # ends the writer, which grpc does not cancel once the
            # call has failed
            for task in readers:
                task.cancel()
            # Collected, so that a stream's error never goes unretrieved.
            await asyncio.gather(*readers, return_exceptions=True)
            link.cancel()
            loads.cancel()

    async def _read_replies(self, link) -> None:
        while (reply := await link.read()) is not grpc.aio.EOF:
            self.on_reply(self.name, reply)

    async def _read_loads(self, loads) -> None:
        while (msg := await loads.read()) is not grpc.aio.EOF:
            self.on_load(self.name, convert.load_from_pb(msg))


async def _drain(outbox: asyncio.Queue):
    """The link's requests, as grpc reads them (its own task writes each in order), until
    None."""
    while (msg := await outbox.get()) is not None:
        yield msg
