"""The admission bound: 429 + Retry-After once the scheduler's waiting queue is full.

Asking the scheduler for ``stats()`` on every request would put a round trip (possibly a whole
iteration) in front of each TTFT, so the queue length is a snapshot at most
``stats_interval_s`` old, refreshed in the background, plus the requests this gateway let in
since the snapshot: a burst cannot slip through between two refreshes."""
from __future__ import annotations

import asyncio
import logging
import time

log = logging.getLogger(__name__)


class AdmissionGate:
    def __init__(self, backend, max_waiting: int | None, interval_s: float):
        self.backend = backend
        self.max_waiting = max_waiting
        self.interval_s = interval_s
        self.num_waiting = 0         # at the last snapshot
        self.admitted_since = 0      # let in since the last snapshot
        self.taken_at = -float("inf")
        self._refresh: asyncio.Task | None = None

    def admit(self) -> bool:
        """True if the request may go to the scheduler (and counts it as waiting)."""
        if self.max_waiting is None:
            return True
        if time.monotonic() - self.taken_at > self.interval_s:
            self._start_refresh()
        if self.num_waiting + self.admitted_since >= self.max_waiting:
            return False
        self.admitted_since += 1
        return True

    def _start_refresh(self) -> None:
        if self._refresh is None or self._refresh.done():
            self._refresh = asyncio.get_running_loop().create_task(self._take())

    async def _take(self) -> None:
        # Requests admitted from here on may be missing from the snapshot; they stay counted.
        counted = self.admitted_since
        try:
            stats = await self.backend.stats()
        except Exception:  # noqa: BLE001 - keep the old snapshot; the next request retries
            log.warning("stats() failed; the admission check uses the last snapshot",
                        exc_info=True)
            return
        self.num_waiting = int(getattr(stats, "num_waiting", 0) or 0)
        self.admitted_since -= counted
        self.taken_at = time.monotonic()
