"""Output lengths as the length-aware policies use them: the predicted length, or a default
for a request whose prediction has not arrived (the running median of finished requests)."""
from __future__ import annotations

import bisect
from collections import deque

from services.scheduler.request import FinishReason, Request

_COMPLETED = (FinishReason.STOP, FinishReason.LENGTH)


class LengthDefaults:
    """Running median of the last ``window`` finished output lengths, ``initial`` until the
    first finishes. A median rather than a mean: one runaway generation must not make every
    unpredicted request look long."""

    def __init__(self, initial: int, window: int = 255, use_median: bool = True):
        self.initial = max(1, initial)
        self.use_median = use_median
        self._recent: deque[int] = deque(maxlen=window)
        self._sorted: list[int] = []

    def observe(self, output_len: int) -> None:
        if not self.use_median:
            return
        if len(self._recent) == self._recent.maxlen:
            old = self._recent[0]
            del self._sorted[bisect.bisect_left(self._sorted, old)]
        self._recent.append(output_len)
        bisect.insort(self._sorted, output_len)

    def observe_finished(self, requests) -> None:
        """Learn from the requests of an iteration that completed (stop or length; not aborts
        or errors, whose lengths say nothing of the workload)."""
        for req in requests:
            if req.finish_reason in _COMPLETED:
                self.observe(req.num_output_tokens)

    @property
    def value(self) -> int:
        if not self._sorted:
            return self.initial
        return max(1, self._sorted[len(self._sorted) // 2])

    def length_of(self, request: Request) -> int:
        """The predicted length (at least 1: a zero or negative prediction is bad input, not
        an instant job), or the default."""
        predicted = request.predicted_output_len
        return self.value if predicted is None else max(1, int(predicted))


def max_output_len(request: Request, max_model_len: int) -> int:
    """The most output tokens the request can produce: no prediction can exceed this."""
    return max(1, min(request.sampling_params.max_tokens,
                      max_model_len - request.num_prompt_tokens))
