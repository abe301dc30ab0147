"""ALISE's multiple priority queues: requests bucketed by estimated remaining time.

Queue q holds requests whose aged remaining time (seconds) lies in (base*2^(q-1), base*2^q]
(queue 0: up to ``base``; the last queue: everything longer). Within a queue a request is
keyed by its *virtual* priority

    key = remaining_s - rate * waited_before + rate * queued_since

so that its effective priority at time ``now``, key - rate * now, improves by ``rate`` for every
second it waits (virtual aging) while the key itself never changes: every queue is a plain
heap with O(log n) push and pop, and since all keys share the same ``- rate * now`` term the
best request overall is the best of the queue heads, O(queues). Each queue also keeps the sum
of its requests' remaining times, which is what Eq. 6 (estimated wait) needs, in O(queues).
"""
from __future__ import annotations

import heapq
import itertools
import math

from services.scheduler.policies.ranked_queue import RankedQueue
from services.scheduler.request import Request


class PriorityQueues:
    def __init__(self, num_queues: int, base_s: float):
        self.base_s = base_s
        self.queues = [RankedQueue() for _ in range(num_queues)]
        self.work = [0.0] * num_queues       # sum of queued remaining seconds per queue
        self._where: dict[str, tuple[int, float]] = {}   # request id -> (queue, its work)
        # head() is asked for every resident of every iteration while the queues change far
        # less often: it is kept until the next push or discard.
        self._head: tuple[float, Request] | None = None
        self._head_known = False

    def bucket(self, seconds: float) -> int:
        if seconds <= self.base_s:
            return 0
        return min(len(self.queues) - 1, 1 + int(math.log2(seconds / self.base_s)))

    def push(self, request: Request, key: float, aged_s: float, work_s: float) -> int:
        """Queue (or re-rank) ``request``; ``aged_s`` is its aged remaining time now, which
        picks the queue. Returns the queue index."""
        self.discard(request)
        self._head_known = False
        q = self.bucket(aged_s)
        self.queues[q].push(request, key)
        self.work[q] += work_s
        self._where[request.request_id] = (q, work_s)
        return q

    def discard(self, request: Request) -> bool:
        where = self._where.pop(request.request_id, None)
        if where is None:
            return False
        q, work_s = where
        self._head_known = False
        self.queues[q].discard(request)
        self.work[q] = max(0.0, self.work[q] - work_s)
        return True

    def head(self) -> tuple[float, Request] | None:
        """(key, request) of the best queued request over all queues."""
        if self._head_known:
            return self._head
        best = None
        for queue in self.queues:
            top = queue.peek()
            if top is not None and (best is None or top[0] < best[0]):
                best = top
        self._head, self._head_known = best, True
        return best

    def best(self, n: int) -> list[tuple[float, Request]]:
        """(key, request) of the ``n`` best queued requests over all queues, best first
        (O(n log n))."""
        merged = heapq.merge(*(queue.smallest(n) for queue in self.queues),
                             key=lambda pair: pair[0])
        return list(itertools.islice(merged, n))

    def work_before(self, q: int) -> float:
        """Queued remaining seconds in the queues ahead of queue ``q`` (Eq. 6)."""
        return sum(self.work[:q])

    def __contains__(self, request: Request) -> bool:
        return request.request_id in self._where

    def __len__(self) -> int:
        return len(self._where)
