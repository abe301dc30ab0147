"""Real-time replay of a workload against one backend.

Requests are handed to the backend once their arrival offset has passed and stamped with their
scheduled arrival time, so a backend that is busy (a long engine step, a whole static batch)
pays for the wait in TTFT and E2EL just as a client would see it.
"""
from __future__ import annotations

import copy
import dataclasses
import math
import time
from collections import deque
from dataclasses import dataclass

from tqdm import tqdm

from lenserve.bench.backends.base import Backend
from lenserve.bench.metrics import RequestRecord
from lenserve.workloads.types import BenchRequest, Workload


@dataclass(frozen=True)
class RunnerConfig:
    show_progress: bool = True
    # Longest sleep while nothing is due; bounds how late an arrival can be submitted.
    idle_poll_s: float = 0.01
    # Short requests run before timing so first-call costs (allocation, kernel selection)
    # are not charged to the first measured requests.
    warmup_requests: int = 2
    warmup_output_len: int = 4


@dataclass
class BackendRun:
    backend: str
    request_rate: float
    duration_s: float
    records: list[RequestRecord]
    profile: object | None = None   # the backend's StepProfile over this run, if it keeps one
    stats: dict | None = None       # engine counters over the run (num_preemptions), if known
    setup: dict | None = None       # what the backend resolved (Backend.describe), if anything


def replay(backend: Backend, workload: Workload, config: RunnerConfig = RunnerConfig(),
           request_rate: float = math.inf) -> BackendRun:
    """Run ``workload`` on a started backend; records come back in workload order."""
    pending = deque(workload.requests)
    done: list[RequestRecord] = []
    label = f"{backend.name} @ {request_rate:g} req/s"
    before = copy.copy(backend.profile())
    counted = backend.counters()
    with tqdm(total=len(pending), desc=label, unit="req", disable=not config.show_progress) as bar:
        start = time.monotonic()
        while pending or backend.has_pending():
            _submit_due(backend, pending, start)
            wait = start + pending[0].arrival_offset - time.monotonic() if pending else config.idle_poll_s
            finished = backend.poll(max(0.0, min(wait, config.idle_poll_s)))
            done.extend(finished)
            bar.update(len(finished))
        duration = time.monotonic() - start
    order = {r.request_id: i for i, r in enumerate(workload.requests)}
    records = sorted((r.shifted(start) for r in done), key=lambda r: order.get(r.request_id, 0))
    after = backend.profile()
    profile = after.since(before) if after is not None and before is not None else None
    counts = backend.counters()
    stats = ({k: v - counted.get(k, 0) for k, v in counts.items()}
             if counts is not None and counted is not None else None)
    return BackendRun(backend.name, request_rate, duration, records, profile, stats=stats,
                      setup=backend.describe() or None)


def _submit_due(backend: Backend, pending: deque[BenchRequest], start: float) -> None:
    now = time.monotonic()
    while pending and start + pending[0].arrival_offset <= now:
        request = pending.popleft()
        backend.submit(request, start + request.arrival_offset)


def warm_up(backend: Backend, workload: Workload, config: RunnerConfig = RunnerConfig()) -> None:
    """Run a few shortened copies of the workload's first requests, untimed. A backend that
    learns from requests gets their shapes with other content (each prompt's first token
    repeated), so that it learns nothing about the measured prompts."""
    head = workload.requests[:config.warmup_requests]
    if not head:
        return
    short = tuple(dataclasses.replace(r, request_id=f"warmup-{i}", arrival_offset=0.0,
                                      output_len=min(r.output_len, config.warmup_output_len))
                  for i, r in enumerate(head))
    if backend.learns_from_requests:
        short = tuple(dataclasses.replace(r, prompt=None, prompt_token_ids=(
            r.prompt_token_ids[0],) * r.prompt_len) for r in short)
    quiet = dataclasses.replace(config, show_progress=False)
    run = replay(backend, Workload("warmup", short), quiet)
    failed = [r.error for r in run.records if not r.success]
    if failed:
        raise RuntimeError(f"{backend.name} failed its warm-up request: {failed[0]}")
