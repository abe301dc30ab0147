"""Small backends and workloads for runner and report tests."""
from __future__ import annotations

import time

from lenserve.bench.backends.base import Backend, BackendOptions, failed_record
from lenserve.bench.metrics import RequestRecord
from lenserve.workloads.types import BenchRequest, Workload


def make_workload(offsets, output_len=3, prompt_len=4) -> Workload:
    requests = tuple(BenchRequest(f"req-{i}", tuple(range(2, 2 + prompt_len)), output_len, t)
                     for i, t in enumerate(offsets))
    return Workload("test", requests)


class SerialBackend(Backend):
    """Serves one request per poll, taking ``step_s`` per token: a busy synchronous server."""

    def __init__(self, step_s=0.0, fail_ids=()):
        super().__init__("serial", BackendOptions())
        self.step_s, self.fail_ids = step_s, set(fail_ids)
        self.queue: list[tuple[BenchRequest, float]] = []
        self.submitted: list[tuple[str, float, float]] = []   # id, arrival, wall time of submit

    def submit(self, request, arrival_time):
        self.submitted.append((request.request_id, arrival_time, time.monotonic()))
        self.queue.append((request, arrival_time))

    def poll(self, timeout):
        if not self.queue:
            time.sleep(timeout)
            return []
        request, arrival = self.queue.pop(0)
        if request.request_id in self.fail_ids:
            return [failed_record(request, arrival, "refused")]
        times = []
        for _ in range(request.output_len):
            time.sleep(self.step_s)
            times.append(time.monotonic())
        return [RequestRecord(request.request_id, request.prompt_len, request.output_len,
                              arrival, times, time.monotonic())]

    def has_pending(self):
        return bool(self.queue)
