"""Max-allocation FCFS baselines: ``orca`` (iteration-level) and ``static`` (request-level).

``orca`` follows Orca (Yu et al., OSDI 2022) as the ALISE and EconoServe papers use it as a
baseline: iteration-level scheduling over an FCFS queue with a fixed maximum batch size
(``max_num_seqs``); on admission a request reserves KV for its whole possible length
(prompt + ``max_tokens``, capped at the context length), so it never needs preemption; its
prompt runs whole in one iteration (no chunking), and new requests join the batch at any
iteration while the reservation, the token budget and the batch size allow.

``static`` is request-level batching as in FasterTransformer-style serving (the "static
batching" baseline of the Orca paper): a batch is formed from the head of the queue, with
the same max-allocation, only when no request is running, and runs until every request in
it has finished; requests that finish early leave idle slots.
"""
from __future__ import annotations

from services.scheduler.output import Budget, SchedulerOutput
from services.scheduler.policies.fcfs import FcfsPolicy
from services.scheduler.request import Request
from services.scheduler.state import SchedulerState


class OrcaPolicy(FcfsPolicy):
    name = "orca"

    def reserved_tokens(self, request: Request) -> int:
        return min(request.num_prompt_tokens + request.sampling_params.max_tokens,
                   self.config.max_model_len)

    def may_admit(self, state: SchedulerState) -> bool:
        return True

    def schedule(self, state: SchedulerState, budget: Budget) -> SchedulerOutput:
        output = state.new_output()
        tokens = budget.max_num_batched_tokens
        for req in state.running.values():
            n = len(req.token_ids) - req.num_computed_tokens
            if n > tokens:
                continue
            output.add(req, n)
            tokens -= n
        if self.may_admit(state):
            self._admit(state, output, tokens, budget.max_num_seqs)
        return output

    def _admit(self, state: SchedulerState, output: SchedulerOutput, tokens: int,
               max_num_seqs: int) -> None:
        waiting, running = self.waiting, state.running
        while waiting and len(running) < max_num_seqs:
            req = waiting[0]
            n = len(req.token_ids) - state.prefix_start(req)
            if n > tokens and output.scheduled:
                break       # an oversized prompt runs alone rather than never
            if not state.admit(req, self.reserved_tokens(req)):
                break
            waiting.popleft()
            output.add(req, n)
            tokens -= n


class StaticPolicy(OrcaPolicy):
    name = "static"

    def may_admit(self, state: SchedulerState) -> bool:
        return not state.running
