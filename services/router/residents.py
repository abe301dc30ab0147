"""What the requests a replica holds still have to run, as the router placed them: the
other half of a placement's cost in normalized latency (``policies.marginal_nl``).

A request joining a replica makes each decode step there a little longer (``beta`` for one
more request, ``alpha`` a token for its KV) for as long as it overlaps each resident; a
resident's normalized latency is its time over its output, so the step it gains costs it
``min(its remaining, the newcomer's output) / its output`` of that increase. Summed over the
residents that needs each one's predicted output and what it has produced: the router keeps
both (``Placement``), counting tokens as it relays them.

``Remaining`` is a replica's residents as of its last load report, sorted by predicted
remaining output with prefix sums, so a placement reads the sum with one bisection whatever
the number of residents; what was placed since the report is added one by one, and what has
finished since is taken out one by one (a few requests each)."""
from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable
from itertools import accumulate
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from services.router.core import Placement

# Output tokens a request past its prediction is still expected to produce: its prediction
# was short, and nothing says by how much.
PAST_PREDICTION_TOKENS = 16


class Remaining:
    def __init__(self, placements: Iterable[Placement]):
        self.terms = {p.request_id: _remaining(p) for p in placements}
        pairs = sorted(self.terms.values())
        self.rems = [rem for rem, _ in pairs]
        # Prefix sums of rem / life and of 1 / life, in the order of ``rems``.
        self.cum_share = [0.0, *accumulate(rem / life for rem, life in pairs)]
        self.cum_inverse = [0.0, *accumulate(1.0 / life for _, life in pairs)]
        self.gone: list[tuple[int, int]] = []      # finished since: their terms, taken out

    def __len__(self) -> int:
        return len(self.terms)

    def finished(self, request_id: str) -> None:
        """A resident finished (or left): its term no longer counts."""
        term = self.terms.pop(request_id, None)
        if term is not None:
            self.gone.append(term)

    def overlap(self, length: int) -> float:
        """The sum over the residents of min(remaining, ``length``) / output."""
        i = bisect_right(self.rems, length)
        total = self.cum_share[i] + length * (self.cum_inverse[-1] - self.cum_inverse[i])
        return total - sum(min(rem, length) / life for rem, life in self.gone)


def _remaining(p: Placement) -> tuple[int, int]:
    """(predicted remaining output, predicted output) of a placed request, in tokens."""
    done = p.num_output_tokens
    life = max(p.predicted_output_len, done + PAST_PREDICTION_TOKENS, 1)
    return life - done, life


def overlap_one(predicted: int, length: int) -> float:
    """``Remaining.overlap``'s term for a request placed since the report (none produced)."""
    return min(predicted, length) / max(predicted, 1)
