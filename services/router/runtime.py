"""The router at run time: the core, one ``ReplicaLink`` per replica, and where each placed
request's chunks go (a ``Generate`` stream's queue, or a subscription's). Runs on one event
loop; every callback from a link is a plain function on that loop, so the core needs no lock.

Placement waits for a replica to be up for at most the request's hold: ``hold_s`` from when it
arrived (or was lost with its replica), and never past its own deadline; past it the request
ends with an error rather than wait on."""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

import grpc

from lenserve_contract.proto import common_pb2
from services.router.core import NoReplica, Placement, RouterCore
from services.router.replicas import ReplicaLink
from services.scheduler import convert
from services.scheduler.load import DEFAULT_OUTPUT_LEN

log = logging.getLogger(__name__)
CHARS_PER_TOKEN = 4         # a text prompt's length before the replica tokenizes it
_POLL_S = 0.02              # how often a held request looks for a replica that came up


class Refused(Exception):
    """The replica refused the request (bad input): the caller gets the same status."""

    def __init__(self, err: grpc.aio.AioRpcError):
        super().__init__(err.details())
        self.err = err


@dataclass
class _Sink:
    queue: asyncio.Queue            # receives lists of TokenChunks
    request: common_pb2.Request
    deadline: float | None          # monotonic; None: none given
    placement: Placement = field(default=None)     # type: ignore[assignment]


class Router:
    def __init__(self, core: RouterCore, predictor=None, *, hold_s: float = 30.0,
                 load_interval_s: float = 0.1,
                 default_output_len: int = DEFAULT_OUTPUT_LEN):
        self.core, self.predictor = core, predictor
        self.hold_s, self.load_interval_s = hold_s, load_interval_s
        self.default_output_len = default_output_len
        self.links: dict[str, ReplicaLink] = {}
        self.sinks: dict[str, _Sink] = {}
        self.num_prediction_failures = 0
        self.num_expired = 0        # held past their deadline with no replica up
        self.num_submit_failures = 0    # a replica's Submit failed (lost, or too slow)

    # -- membership --------------------------------------------------------------------------
    def set_replicas(self, names: list[str]) -> None:
        """Follow discovery: link new replicas; a replica gone from it is lost and forgotten."""
        for name in names:
            if name not in self.links:
                self.core.add_replica(name)
                link = ReplicaLink(name, self.core.on_load, self._on_chunks, self._on_lost,
                                   load_interval_s=self.load_interval_s)
                self.links[name] = link
                link.start()
        for name in [n for n in self.links if n not in names]:
            link = self.links.pop(name)
            asyncio.ensure_future(link.close())
            self._handle_lost(name, *self.core.remove_replica(name))

    async def close(self) -> None:
        await asyncio.gather(*(link.close() for link in self.links.values()))
        self.links.clear()
        if self.predictor is not None:
            await self.predictor.close()

    # -- requests ----------------------------------------------------------------------------
    async def start(self, request: common_pb2.Request, queue: asyncio.Queue,
                    deadline: float | None, place_by: float | None = None) -> None:
        """Predict, place and send one request; its chunks go to ``queue`` from now on.
        ``deadline``: the request's own (monotonic; None: the caller enforces one);
        ``place_by``: when the call that sends it gives up (a ``Submit``'s deadline).
        Raises Refused (bad input), NoReplica (none up within its hold) or ValueError (the id
        is already running)."""
        rid = request.request_id
        if not rid or rid in self.sinks:
            raise ValueError(f"request_id {rid!r} is empty or already running")
        sink = self.sinks[rid] = _Sink(queue, request, deadline)
        try:
            sink.placement = await self._placement(request)
            until = self._hold_until(deadline)
            await self._send(sink, frozenset(), until if place_by is None else
                             min(until, place_by))
        except BaseException:
            self.sinks.pop(rid, None)
            self.core.unplace(rid)
            raise

    async def abort(self, request_id: str) -> bool:
        sink = self.sinks.get(request_id)
        if sink is None or sink.placement is None or not sink.placement.replica:
            return False
        del self.sinks[request_id]
        link = self.links.get(sink.placement.replica)
        self.core.on_finished(request_id)
        if link is not None:
            await link.abort(request_id)
        sink.queue.put_nowait([_aborted(request_id)])    # its stream ends as the replica's would
        return True

    def drop(self, request_id: str) -> None:
        """Its caller went away (the abort is the caller's to send)."""
        self.sinks.pop(request_id, None)
        self.core.on_finished(request_id)

    async def _placement(self, request: common_pb2.Request) -> Placement:
        prompt_tokens = len(request.prompt_token_ids) or \
            max(1, len(request.prompt) // CHARS_PER_TOKEN)
        if request.HasField("predicted_output_len"):
            predicted = request.predicted_output_len
        elif self.predictor is not None and self.core.policy.needs_prediction and request.prompt:
            predicted = await self._predict(request.prompt)
            request.predicted_output_len = predicted      # the replica need not predict again
        else:
            predicted = self.default_output_len
        keys = self.core.prefix_keys(request.prompt_token_ids, request.prompt)
        return Placement(request.request_id, prompt_tokens, predicted, prefix_keys=keys)

    async def _predict(self, prompt: str) -> int:
        try:
            return max(1, (await self.predictor.predict([prompt]))[0].length)
        except (grpc.aio.AioRpcError, OSError) as exc:
            self.num_prediction_failures += 1
            log.warning("predictor unavailable, default length: %s", exc)
            return self.default_output_len

    def _hold_until(self, deadline: float | None) -> float:
        hold = time.monotonic() + self.hold_s
        return hold if deadline is None else min(hold, deadline)

    async def _send(self, sink: _Sink, exclude: frozenset[str], until: float) -> None:
        """Place and submit, trying another replica while one fails to take it."""
        placement = sink.placement
        while True:
            try:
                view = self.core.place(placement, exclude)
            except NoReplica:
                if time.monotonic() >= until:
                    self.num_expired += 1
                    raise
                await asyncio.sleep(_POLL_S)
                continue
            try:
                # The rest of the hold: a replica whose streams are open is slow, not lost (a
                # lost one ends them and is drained), and another is no faster to take it.
                await self.links[view.name].submit(sink.request,
                                                   max(0.001, until - time.monotonic()))
                return
            except grpc.aio.AioRpcError as err:
                self.core.unplace(placement.request_id)
                if err.code() == grpc.StatusCode.INVALID_ARGUMENT:
                    raise Refused(err) from None
                self.num_submit_failures += 1
                log.warning("replica %s did not take request %s: %s; trying another", view.name,
                            placement.request_id, err.details() or err.code())
                if err.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                    # It may yet add the request after the call gave up: stop it there, so
                    # that it does not run twice.
                    asyncio.ensure_future(self.links[view.name].abort(placement.request_id))
                exclude |= {view.name}        # lost or not subscribed yet: another one
                if time.monotonic() >= until:
                    raise NoReplica(f"replica {view.name} did not take the request: "
                                    f"{err.details()}") from None

    # -- callbacks from the links ------------------------------------------------------------
    def _on_chunks(self, replica: str, chunks) -> None:
        by_queue: dict[int, tuple[asyncio.Queue, list]] = {}
        for chunk in chunks:
            sink = self.sinks.get(chunk.request_id)
            if sink is None or sink.placement is None or sink.placement.replica != replica:
                continue        # an aborted request's last chunk, or a stale replica's
            self.core.on_tokens(chunk.request_id, len(chunk.token_ids))
            if chunk.finished:
                self.sinks.pop(chunk.request_id, None)
                self.core.on_finished(chunk.request_id)
            by_queue.setdefault(id(sink.queue), (sink.queue, []))[1].append(chunk)
        for queue, batch in by_queue.values():
            queue.put_nowait(batch)

    def _on_lost(self, replica: str) -> None:
        self._handle_lost(replica, *self.core.replica_lost(replica))

    def _handle_lost(self, replica: str, replace: list[Placement],
                     fail: list[Placement]) -> None:
        for placement in fail:
            sink = self.sinks.pop(placement.request_id, None)
            if sink is not None:
                sink.queue.put_nowait([convert.error_chunk(placement.request_id, (
                    f"scheduler replica {replica} failed after {placement.num_output_tokens} "
                    "output tokens; a started request is not moved (send it again)"))])
        for placement in replace:
            sink = self.sinks.get(placement.request_id)
            if sink is not None:
                asyncio.ensure_future(self._replace(sink, replica))

    async def _replace(self, sink: _Sink, lost: str) -> None:
        rid = sink.request.request_id
        try:
            await self._send(sink, frozenset({lost}), self._hold_until(sink.deadline))
        except (NoReplica, Refused) as exc:
            if self.sinks.pop(rid, None) is not None:
                self.core.on_finished(rid)
                sink.queue.put_nowait([convert.error_chunk(rid, (
                    f"scheduler replica {lost} failed before the request started and no other "
                    f"took it: {exc}"))])


def _aborted(request_id: str) -> common_pb2.TokenChunk:
    return common_pb2.TokenChunk(request_id=request_id, finished=True,
                                 finish_reason=common_pb2.FINISH_REASON_ABORT)
