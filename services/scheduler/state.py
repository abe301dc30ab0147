"""Request state and the only transitions that change it.

Keeping every transition here, with the block frees and allocations it implies, is what lets
``check_integrity`` hold after any policy's decisions."""
from __future__ import annotations

from collections import Counter

from services.scheduler.block_manager import BlockManager
from services.scheduler.config import SchedulerConfig
from services.scheduler.output import SchedulerOutput
from services.scheduler.request import FinishReason, Request, RequestStatus

_QUEUED = (RequestStatus.WAITING, RequestStatus.PREEMPTED, RequestStatus.SWAPPED)


class SchedulerState:
    def __init__(self, config: SchedulerConfig):
        self.config = config
        self.block_manager = BlockManager(config.num_gpu_blocks, config.block_size)
        self.requests: dict[str, Request] = {}     # unfinished requests only
        self.counts: Counter[RequestStatus] = Counter()
        self.now = 0.0
        self.iteration = 0
        self.num_finished = 0
        self.num_preemptions = 0

    def new_output(self) -> SchedulerOutput:
        return SchedulerOutput(iteration=self.iteration)

    def _set_status(self, request: Request, status: RequestStatus) -> None:
        self.counts[request.status] -= 1
        self.counts[status] += 1
        request.status = status

    def add(self, request: Request) -> None:
        self.requests[request.request_id] = request
        self.counts[request.status] += 1

    def admit(self, request: Request) -> None:
        """A waiting or preempted request whose blocks the policy has just allocated."""
        assert request.status in (RequestStatus.WAITING, RequestStatus.PREEMPTED), request
        self._set_status(request, RequestStatus.RUNNING)

    def preempt(self, request: Request, output: SchedulerOutput) -> None:
        """Drop the request's KV; it is recomputed (prompt and outputs so far) when readmitted."""
        self.block_manager.free(request.request_id)
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        self.num_preemptions += 1
        self._set_status(request, RequestStatus.PREEMPTED)
        output.preempted.append(request)

    def swap_out(self, request: Request, output: SchedulerOutput) -> None:
        """Move the request's KV to the host tier; its computed tokens survive."""
        blocks = self.block_manager.free(request.request_id)
        request.num_preemptions += 1
        self.num_preemptions += 1
        self._set_status(request, RequestStatus.SWAPPED)
        output.swapped_out.append((request.request_id, list(blocks)))

    def swap_in(self, request: Request, output: SchedulerOutput) -> bool:
        """Bring a swapped request back onto the device, if its blocks fit."""
        assert request.status is RequestStatus.SWAPPED, request
        rid = request.request_id
        if not self.block_manager.allocate_slots(rid, request.num_computed_tokens):
            return False
        self._set_status(request, RequestStatus.RUNNING)
        output.swapped_in.append((rid, list(self.block_manager.block_table(rid))))
        return True

    def finish(self, request: Request, reason: FinishReason) -> None:
        # Finished requests leave the tracked set, so they drop out of the status counts.
        self.block_manager.free(request.request_id)
        self.counts[request.status] -= 1
        request.status = reason.status
        request.finish_reason = reason
        request.metrics.finished_time = self.now
        del self.requests[request.request_id]
        self.num_finished += 1

    def num_queued(self) -> int:
        return sum(self.counts[s] for s in _QUEUED)

    def check_integrity(self) -> None:
        """Block accounting agrees with request state. Raises AssertionError if not."""
        bm = self.block_manager
        bm.check_integrity()
        for rid, req in self.requests.items():
            held = bm.num_blocks_of(rid)
            if req.status is RequestStatus.RUNNING:
                assert held * bm.block_size >= req.num_computed_tokens, f"{req} lost KV blocks"
            else:
                assert held == 0, f"{req} holds {held} device blocks while {req.status.value}"
            if req.status is RequestStatus.PREEMPTED:
                assert req.num_computed_tokens == 0, f"{req} preempted with computed tokens"
            assert req.num_computed_tokens <= req.num_tokens, f"{req} computed past its tokens"
        assert bm.owners() <= set(self.requests), f"blocks held by gone {bm.owners() - set(self.requests)}"
        live = Counter(r.status for r in self.requests.values())
        assert +self.counts == +live, f"status counts {dict(self.counts)} != {dict(live)}"
