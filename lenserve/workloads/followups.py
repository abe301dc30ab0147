"""When each request of a workload is due: open-loop requests at their arrival offset, and
follow-ups (the next turn of a conversation, ``BenchRequest.after``) once the request they
follow has finished, plus their think time. Both replay loops (real time and virtual time)
drive one of these, so a conversation's turns never overlap and a slow reply delays the next
turn as it would a user."""
from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterable

from lenserve.workloads.types import BenchRequest


class Arrivals:
    def __init__(self, requests: Iterable[BenchRequest]):
        self._due: list[tuple[float, int, BenchRequest]] = []     # (due, order, request)
        self._order = itertools.count()
        self._after: dict[str, list[BenchRequest]] = {}
        for r in requests:
            if r.after is None:
                self._due.append((r.arrival_offset, next(self._order), r))
            else:
                self._after.setdefault(r.after, []).append(r)
        heapq.heapify(self._due)

    def __bool__(self) -> bool:
        """Requests still to submit (due later, or waiting for the turn they follow)."""
        return bool(self._due or self._after)

    def next_time(self) -> float | None:
        """When the next known request is due (None: only follow-ups of running turns)."""
        return self._due[0][0] if self._due else None

    def pop_due(self, now: float) -> list[tuple[BenchRequest, float]]:
        """Requests due by ``now``, with the time each was due (its arrival)."""
        out = []
        while self._due and self._due[0][0] <= now:
            due, _, request = heapq.heappop(self._due)
            out.append((request, due))
        return out

    def finished(self, request_id: str, at: float) -> None:
        """``request_id`` finished (or failed) at ``at``: its follow-ups are due after their
        think time. A failed turn releases the next one too (the user asks again)."""
        for r in self._after.pop(request_id, ()):
            heapq.heappush(self._due, (at + r.think_s, next(self._order), r))
