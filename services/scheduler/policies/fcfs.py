"""Queue plumbing shared by the FCFS policies (vllm, orca, static)."""
from __future__ import annotations

from collections import deque

from services.scheduler.policy import Policy
from services.scheduler.request import Request, RequestStatus


class FcfsPolicy(Policy):
    """One FCFS waiting queue; the running set is ``state.running`` (admission order)."""

    def __init__(self, config, policy_config=None):
        super().__init__(config, policy_config)
        self.waiting: deque[Request] = deque()

    def add_request(self, request: Request) -> None:
        self.waiting.append(request)

    def remove_request(self, request: Request) -> None:
        # Only aborts of queued requests reach the (rarely long) scan of the waiting queue.
        if request.status is not RequestStatus.RUNNING:
            try:
                self.waiting.remove(request)
            except ValueError:
                pass

    def num_queued(self) -> int:
        return len(self.waiting)
