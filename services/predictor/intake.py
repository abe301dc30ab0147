"""Screening of observed completions before they teach the predictor.

A completion teaches the served model's length only if it is one: 0 tokens is a failed
request, more than max_length is a corrupt record, and a request id seen before is a
redelivery (Kafka delivers at least once) that would count one reply twice. Each is refused
with a reason and counted; none stops the others in its batch.
"""
from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Callable, Sequence

import numpy as np

from services.predictor.types import Completion, PredictionError


class RecentIds:
    """The last `capacity` request ids learnt from, for dropping redelivered completions."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self._ids: OrderedDict[str, None] = OrderedDict()

    def __contains__(self, request_id: str) -> bool:
        return bool(request_id) and request_id in self._ids

    def add(self, request_ids) -> None:
        """Remember ids once their records were learnt from (a refused batch may be resent)."""
        for rid in request_ids:
            if rid and self.capacity > 0:
                self._ids[rid] = None
                self._ids.move_to_end(rid)
        while len(self._ids) > max(0, self.capacity):
            self._ids.popitem(last=False)


def check_prompt(prompt, field: str) -> PredictionError | None:
    if not isinstance(prompt, str):
        return PredictionError("INVALID_ARGUMENT", f"prompt must be a string, got "
                               f"{type(prompt).__name__}", field)
    if not prompt.strip():
        return PredictionError("INVALID_ARGUMENT", "prompt is empty", field)
    return None


def check_length(n, max_length: int) -> PredictionError | None:
    if not isinstance(n, (int, np.integer)) or isinstance(n, bool):
        return PredictionError("INVALID_ARGUMENT", f"num_output_tokens must be an integer, "
                               f"got {n!r}", "num_output_tokens")
    if not 0 < n <= max_length:
        return PredictionError("INVALID_ARGUMENT", f"num_output_tokens {n} is outside "
                               f"1..{max_length}: not a completed reply", "num_output_tokens")
    return None


def screen(records: Sequence[Completion], default_model: str, max_length: int,
           check_model: Callable[[str], PredictionError | None], recent: RecentIds,
           stats: Counter) -> tuple[dict[str, list[Completion]], list[PredictionError]]:
    """The records worth learning from, grouped by model, and an error per refused one."""
    by_model: dict[str, list[Completion]] = {}
    errors, batch_ids = [], set()
    for rec in records:
        model = rec.model or default_model
        duplicate = rec.request_id in recent or rec.request_id in batch_ids
        err, reason = _refusal(rec, model, max_length, check_model, duplicate)
        if err is None:
            by_model.setdefault(model, []).append(rec)
            if rec.request_id:
                batch_ids.add(rec.request_id)
            continue
        stats[reason] += 1
        errors.append(PredictionError(err.code, f"{rec.request_id}: {err.message}", err.field))
    return by_model, errors


def _refusal(rec: Completion, model: str, max_length: int, check_model,
             duplicate: bool) -> tuple[PredictionError | None, str]:
    if err := check_model(model):
        return err, "rejected_model"
    if err := check_prompt(rec.prompt, "prompt"):
        return err, "rejected_prompt"
    if err := check_length(rec.num_output_tokens, max_length):
        return err, "rejected_length"
    if duplicate:
        return PredictionError("INVALID_ARGUMENT", "duplicate request_id: this completion "
                               "was already observed", "request_id"), "duplicate"
    return None, ""
