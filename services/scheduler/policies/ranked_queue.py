"""A keyed min-heap of requests with lazy removal: the waiting queue of the length-aware
policies.

Push, pop and peek are O(log n); removing or re-ranking a request only forgets its live entry
(the stale one is skipped when it reaches the top), so an abort or a late prediction never
scans the queue."""
from __future__ import annotations

import heapq
import itertools
from typing import Any

from services.scheduler.request import Request


class RankedQueue:
    def __init__(self):
        self._heap: list[tuple[Any, int, Request]] = []
        self._live: dict[str, int] = {}      # request id -> id of its one live entry
        self._ids = itertools.count()

    def push(self, request: Request, key: Any) -> None:
        """Queue ``request`` under ``key`` (smaller first; equal keys in push order). Pushing a
        queued request again re-ranks it."""
        entry = next(self._ids)
        self._live[request.request_id] = entry
        heapq.heappush(self._heap, (key, entry, request))
        if len(self._heap) > 2 * len(self._live) + 64:
            self._compact()

    def discard(self, request: Request) -> bool:
        return self._live.pop(request.request_id, None) is not None

    def peek(self) -> tuple[Any, Request] | None:
        heap, live = self._heap, self._live
        while heap and live.get(heap[0][2].request_id) != heap[0][1]:
            heapq.heappop(heap)
        return (heap[0][0], heap[0][2]) if heap else None

    def pop(self) -> Request:
        head = self.peek()
        assert head is not None, "pop from an empty RankedQueue"
        heapq.heappop(self._heap)
        del self._live[head[1].request_id]
        return head[1]

    def smallest(self, n: int):
        """Up to ``n`` live (key, request) pairs, best first, without removing them: a
        best-first walk of the heap's tree, O(n log n) plus the stale entries met."""
        heap, live, frontier, found = self._heap, self._live, [], 0
        if heap:
            frontier.append((heap[0][0], heap[0][1], 0))
        while frontier and found < n:
            _, _, i = heapq.heappop(frontier)
            key, entry, request = heap[i]
            if live.get(request.request_id) == entry:
                found += 1
                yield key, request
            for child in (2 * i + 1, 2 * i + 2):
                if child < len(heap):
                    heapq.heappush(frontier, (heap[child][0], heap[child][1], child))

    def __len__(self) -> int:
        return len(self._live)

    def __contains__(self, request: Request) -> bool:
        return request.request_id in self._live

    def _compact(self) -> None:
        # Amortised O(1) per push: stale entries never outnumber live ones by much.
        live = self._live
        self._heap = [e for e in self._heap if live.get(e[2].request_id) == e[1]]
        heapq.heapify(self._heap)
