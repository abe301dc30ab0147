"""Queue plumbing shared by the FCFS policies (vllm, orca, static)."""
from __future__ import annotations

from collections import deque

from services.scheduler.output import SchedulerOutput
from services.scheduler.policy import Policy
from services.scheduler.request import Request, RequestStatus
from services.scheduler.state import SchedulerState


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

    def admit_fcfs(self, state: SchedulerState, output: SchedulerOutput, tokens: int,
                   max_num_seqs: int) -> int:
        """Admit from the head of the queue while the token budget, ``max_num_seqs`` and the
        free blocks allow; returns the tokens left."""
        waiting, running = self.waiting, state.running
        chunked = self.config.enable_chunked_prefill
        while waiting and tokens > 0 and len(running) < max_num_seqs:
            req = waiting[0]
            start = state.prefix_start(req)
            n = len(req.token_ids) - start
            if n > tokens:
                # Without chunking a prompt must run whole; an oversized one runs alone.
                if chunked:
                    n = tokens
                elif output.scheduled:
                    break
            if not state.admit(req, start + n):
                break
            waiting.popleft()
            output.add(req, n)
            tokens -= n
        return tokens
