"""A reservation for the head of EconoServe's GT queue, with backfilling around it.

When the head GT's allocation does not fit the free (unreserved) KV, the running GTs' predicted
remainders say when enough of it frees: the *shadow* iteration count ``T``, and the blocks left
over then beyond the head's need (``extra``). A smaller queued GT may start meanwhile only if
it is predicted to end within ``T`` or fits in ``extra``: either way the head's start is not
pushed later, so its wait is bounded by the running GTs' remainders (EASY backfilling, as
batch schedulers bound the wait of a large job).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Reservation:
    shadow: int | None     # iterations until the head fits (None: not by running GTs alone)
    extra: int             # blocks spare at the shadow beyond the head's need

    def admits(self, remaining: int, size: int) -> bool:
        """Whether a GT of ``remaining`` tokens and ``size`` blocks may start now."""
        return (self.shadow is not None and remaining <= self.shadow) or size <= self.extra

    def take(self, remaining: int, size: int) -> None:
        if not (self.shadow is not None and remaining <= self.shadow):
            self.extra -= size


def reserve(need: int, free: int, releases: list[tuple[int, int]]) -> Reservation:
    """``need`` blocks for the head, ``free`` unreserved free blocks now, ``releases`` the
    running GTs' (predicted remaining tokens, blocks they give back at their end)."""
    avail = free
    if avail >= need:
        return Reservation(0, avail - need)
    for remaining, blocks in sorted(releases):
        avail += blocks
        if avail >= need:
            return Reservation(remaining, avail - need)
    return Reservation(None, -1)
