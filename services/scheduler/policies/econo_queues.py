"""EconoServe's ordered waiting queues (paper §3.4).

Tasks are ordered by three factors, each quantised into ranges so that requests in the same
range keep arrival order: the SLO deadline ascending, then the KV they already occupy
descending (release it sooner), then their size descending (predicted output length for
generation tasks, prompt length for prompt tasks; large ones first fill a resource with few
picks). A second index sorted by size serves the paper's binary search for "a task close to
the required length" when the head does not fit what is left of a budget.

Keys are computed when a request enters the queue and do not depend on the clock, so both
indices stay sorted without re-keying; a new prediction re-inserts the request.
"""
from __future__ import annotations

import bisect
import itertools
from dataclasses import dataclass

from services.scheduler.request import Request


@dataclass(frozen=True)
class Ordering:
    """Range widths of the three ordering factors."""

    deadline_range_s: float
    kv_range_blocks: int
    length_range_tokens: int

    def key(self, deadline: float, occupied_blocks: int, length: int) -> tuple:
        return (int(deadline // self.deadline_range_s),
                -(occupied_blocks // self.kv_range_blocks),
                -(length // self.length_range_tokens))


class OrderedQueue:
    """Requests in priority order, with a size index for best-fit picks. Insert and remove
    are a binary search plus a list shift (fast in practice even at tens of thousands)."""

    def __init__(self):
        self._by_priority: list[tuple] = []
        self._by_size: list[tuple[int, int]] = []
        self._entries: dict[str, tuple[tuple, int, Request]] = {}   # rid -> (key, size, req)
        self._by_seq: dict[int, Request] = {}
        self._seq = itertools.count()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, request: Request) -> bool:
        return request.request_id in self._entries

    def push(self, request: Request, key: tuple, size: int) -> None:
        assert request.request_id not in self._entries, request
        seq = next(self._seq)
        full = (*key, seq)
        bisect.insort(self._by_priority, full)
        bisect.insort(self._by_size, (size, seq))
        self._entries[request.request_id] = (full, size, request)
        self._by_seq[seq] = request

    def remove(self, request: Request) -> bool:
        entry = self._entries.pop(request.request_id, None)
        if entry is None:
            return False
        full, size, _ = entry
        del self._by_priority[bisect.bisect_left(self._by_priority, full)]
        del self._by_size[bisect.bisect_left(self._by_size, (size, full[-1]))]
        del self._by_seq[full[-1]]
        return True

    def head(self) -> Request | None:
        return self._by_seq[self._by_priority[0][-1]] if self._by_priority else None

    def tail(self) -> Request | None:
        return self._by_seq[self._by_priority[-1][-1]] if self._by_priority else None

    def ordered(self):
        """Requests in priority order (a snapshot: callers may remove while iterating)."""
        return [self._by_seq[k[-1]] for k in list(self._by_priority)]

    def size_of(self, request: Request) -> int:
        return self._entries[request.request_id][1]

    def largest_fitting(self, limit: int) -> Request | None:
        """The request of largest size <= ``limit`` (binary search on the size index)."""
        i = bisect.bisect_right(self._by_size, (limit, float("inf")))
        return self._by_seq[self._by_size[i - 1][1]] if i else None
