"""Sarathi-Serve (Agrawal et al., OSDI 2024): chunked prefill with stall-free batching.

Every iteration first gives each running decode its token, then spends what is left of the
token budget on prefill chunks: running (partially prefilled) prompts first, then new ones in
FCFS order. Prefills never preempt decodes: a prompt is admitted only into free blocks, and
when a decode cannot grow, the victim is the most recently admitted *prefilling* request
before any decode (recompute, as vLLM), so decodes keep streaming while prompts are ingested.
"""
from __future__ import annotations

from dataclasses import dataclass

from services.scheduler.output import Budget, SchedulerOutput
from services.scheduler.policies.fcfs import FcfsPolicy
from services.scheduler.policy import PolicyConfig
from services.scheduler.request import Request, RequestStatus
from services.scheduler.state import SchedulerState

_RUNNING = RequestStatus.RUNNING


@dataclass(frozen=True)
class SarathiConfig(PolicyConfig):
    token_budget: int = 0       # tokens per iteration; 0: max_num_batched_tokens


class SarathiPolicy(FcfsPolicy):
    name = "sarathi"
    config_class = SarathiConfig

    def __init__(self, config, policy_config=None):
        super().__init__(config, policy_config)
        if self.options.token_budget < 0:
            raise ValueError("sarathi: token_budget must be >= 0")

    def schedule(self, state: SchedulerState, budget: Budget) -> SchedulerOutput:
        output = state.new_output()
        tokens = self.options.token_budget or budget.max_num_batched_tokens
        decodes, prefills = self._split(state)
        tokens = self._run(state, output, decodes, tokens)
        tokens = self._run(state, output, prefills, tokens)
        if not output.preempted:
            self._admit(state, output, tokens, budget.max_num_seqs)
        return output

    @staticmethod
    def _split(state: SchedulerState) -> tuple[list[Request], list[Request]]:
        decodes, prefills = [], []
        for req in state.running.values():
            pending = req.num_tokens - req.num_computed_tokens
            (decodes if pending == 1 and req.num_output_tokens else prefills).append(req)
        return decodes, prefills

    def _run(self, state: SchedulerState, output: SchedulerOutput, reqs: list[Request],
             tokens: int) -> int:
        allocate = state.block_manager.allocate_slots
        for req in reqs:
            if tokens <= 0:
                break
            if req.status is not _RUNNING:
                continue
            n = min(req.num_tokens - req.num_computed_tokens, tokens)
            while not allocate(req.request_id, req.num_computed_tokens + n):
                victim = self._victim(state, output, req)
                state.preempt(victim, output)
                self.waiting.appendleft(victim)
                if victim is req:
                    break
            if req.status is _RUNNING:
                output.add(req, n)
                tokens -= n
        return tokens

    @staticmethod
    def _victim(state: SchedulerState, output: SchedulerOutput, req: Request) -> Request:
        """The latest-admitted unscheduled prefill, else the latest-admitted unscheduled
        request; ``req`` itself when every other holder already runs in this batch."""
        taken = {r.request_id for r, _ in output.scheduled}
        latest = None
        for cand in reversed(state.running.values()):
            if cand.request_id in taken or cand is req:
                continue
            if cand.num_computed_tokens < cand.num_prompt_tokens:
                return cand
            latest = latest or cand
        return latest or req

    def _admit(self, state: SchedulerState, output: SchedulerOutput, tokens: int,
               max_num_seqs: int) -> None:
        waiting, running = self.waiting, state.running
        while waiting and tokens > 0 and len(running) < max_num_seqs:
            req = waiting[0]
            n = min(req.num_tokens - state.prefix_start(req), tokens)
            # Blocks for the whole prompt up front: a later chunk never stalls a decode.
            if not state.admit(req, req.num_tokens):
                break
            waiting.popleft()
            output.add(req, n)
            tokens -= n
