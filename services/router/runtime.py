"""The router at run time: the core, one ``ReplicaLink`` per replica, and where each placed
request's chunks go (a ``Generate`` stream's queue, or a subscription's). Runs on one event
loop; every callback from a link is a plain function on that loop, so the core needs no lock.

Sending a request is a message on the replica's link; nothing waits for its admission before
the first chunk can be relayed (a ``Submit`` waits for it, to answer with the replica's
refusal as a replica would). A refused request's error goes to whoever waits on it; a replica
that could not take it (its engine stopped) has it placed elsewhere.

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

    def __init__(self, message: str, field: str = "",
                 code: grpc.StatusCode = grpc.StatusCode.INVALID_ARGUMENT):
        super().__init__(message)
        self.message, self.field, self.code = message, field, code


@dataclass
class _Sink:
    queue: asyncio.Queue            # receives lists of TokenChunks
    request: common_pb2.Request
    deadline: float | None          # monotonic; None: none given
    placement: Placement = field(default=None)     # type: ignore[assignment]
    # Set once a replica admitted it (an admission or a chunk), or to the reason none did;
    # only a caller that answers with it (``Submit``) asks for one.
    admitted: asyncio.Future | None = None
    until: float = 0.0              # monotonic: the end of its hold, placing it first


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
        self.num_submit_failures = 0    # a replica could not take a request (engine stopped)

    # -- membership --------------------------------------------------------------------------
    def set_replicas(self, names: list[str]) -> None:
        """Follow discovery: link new replicas; a replica gone from it is lost and forgotten."""
        for name in names:
            if name not in self.links:
                self.core.add_replica(name)
                link = ReplicaLink(name, self.core.on_load, self._on_reply, self._on_lost,
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
                    deadline: float | None, place_by: float | None = None,
                    admitted: bool = False) -> None:
        """Predict, place and send one request; its chunks go to ``queue`` from now on, and a
        refusal (Refused) too, unless ``admitted``: then this returns once a replica admitted
        it, and raises the refusal. ``deadline``: the request's own (monotonic; None: the
        caller enforces one); ``place_by``: when the call that sends it gives up (a
        ``Submit``'s deadline). Raises Refused (bad input), NoReplica (none up within its
        hold) or ValueError (the id is already running)."""
        rid = request.request_id
        if not rid or rid in self.sinks:
            raise ValueError(f"request_id {rid!r} is empty or already running")
        sink = self.sinks[rid] = _Sink(queue, request, deadline)
        if admitted:
            sink.admitted = asyncio.get_running_loop().create_future()
        try:
            sink.placement = await self._placement(request)
            until = self._hold_until(deadline)
            sink.until = until if place_by is None else min(until, place_by)
            await self._send(sink, frozenset(), sink.until)
            if sink.admitted is not None:
                await sink.admitted
        except BaseException:
            if self.sinks.get(rid) is sink:
                self.abort(rid, notify=False)
            raise

    def abort(self, request_id: str, notify: bool = True) -> bool:
        """Stop a request wherever it was sent; its stream ends as the replica's would (unless
        not ``notify``: its caller has gone)."""
        sink = self.sinks.pop(request_id, None)
        if sink is None:
            return False
        replica = sink.placement.replica if sink.placement is not None else ""
        self.core.on_finished(request_id)
        if replica in self.links:
            self.links[replica].abort(request_id)
        if notify:
            sink.queue.put_nowait([_aborted(request_id)])
        _settle(sink.admitted)          # a Submit that waits on it returns: it has ended
        return bool(replica)

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
        """Place and send, waiting for a replica to be up until ``until``."""
        placement = sink.placement
        while True:
            if self.sinks.get(placement.request_id) is not sink:
                return      # aborted while it waited
            try:
                view = self.core.place(placement, exclude)
            except NoReplica:
                if time.monotonic() >= until:
                    self.num_expired += 1
                    raise
                await asyncio.sleep(_POLL_S)
                continue
            if self.links[view.name].submit(sink.request):
                return
            self.core.unplace(placement.request_id)     # its link is down: being lost
            exclude |= {view.name}

    # -- callbacks from the links ------------------------------------------------------------
    def _on_reply(self, replica: str, reply) -> None:
        for admission in reply.admissions:
            self._on_admission(replica, admission)
        if reply.chunks:
            self._on_chunks(replica, reply.chunks)

    def _sink_on(self, replica: str, request_id: str) -> _Sink | None:
        """The request's sink if it is (still) placed on ``replica``: not an aborted request's
        late message, nor a message from a replica it has left."""
        sink = self.sinks.get(request_id)
        if sink is None or sink.placement is None or sink.placement.replica != replica:
            return None
        return sink

    def _on_admission(self, replica: str, admission) -> None:
        sink = self._sink_on(replica, admission.request_id)
        if sink is None:
            return
        if not admission.HasField("error"):
            _settle(sink.admitted)
            return
        rid, error = admission.request_id, admission.error
        self.core.unplace(rid)
        if error.code == common_pb2.ERROR_CODE_UNAVAILABLE:
            self.num_submit_failures += 1
            log.warning("replica %s did not take request %s: %s; trying another", replica, rid,
                        error.message)
            asyncio.ensure_future(self._replace(sink, replica, sink.until))
            return
        del self.sinks[rid]
        self._fail(sink, Refused(error.message, error.field))

    @staticmethod
    def _fail(sink: _Sink, exc: Exception, message: str = "") -> None:
        """The request ends unsent: its waiting ``Submit`` raises ``exc``; a ``Generate``
        stream ends with a refusal's status; otherwise the request's stream ends with an
        error chunk (``message``)."""
        if sink.admitted is not None and not sink.admitted.done():
            sink.admitted.set_exception(exc)
        elif isinstance(exc, Refused) and sink.admitted is None:
            sink.queue.put_nowait(exc)
        else:
            sink.queue.put_nowait([convert.error_chunk(sink.request.request_id,
                                                       message or str(exc))])

    def _on_chunks(self, replica: str, chunks) -> None:
        by_queue: dict[int, tuple[asyncio.Queue, list]] = {}
        for chunk in chunks:
            sink = self._sink_on(replica, chunk.request_id)
            if sink is None:
                continue
            _settle(sink.admitted)      # its chunk may come before its admission
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

    async def _replace(self, sink: _Sink, lost: str, until: float | None = None) -> None:
        """Place again a request ``lost`` held unstarted (a new hold), or one it could not take
        (``until``: within the first hold, and the same replica not again at once)."""
        rid = sink.request.request_id
        try:
            if until is not None:
                if not self.core.up_replicas(frozenset({lost})):
                    await asyncio.sleep(_POLL_S)
                if time.monotonic() >= until:
                    self.num_expired += 1
                    raise NoReplica(f"replica {lost} could not take the request")
            await self._send(sink, frozenset({lost}), until or self._hold_until(sink.deadline))
        except NoReplica as exc:
            if self.sinks.pop(rid, None) is not None:
                self.core.on_finished(rid)
                self._fail(sink, exc, f"scheduler replica {lost} failed before the request "
                                      f"started and no other took it: {exc}")


def _settle(admitted: asyncio.Future | None) -> None:
    if admitted is not None and not admitted.done():
        admitted.set_result(None)


def _aborted(request_id: str) -> common_pb2.TokenChunk:
    return common_pb2.TokenChunk(request_id=request_id, finished=True,
                                 finish_reason=common_pb2.FINISH_REASON_ABORT)
