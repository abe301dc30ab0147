"""MultiRes, the multi-resource baseline of the EconoServe paper (§2, "UnsyncCoupled"): exact
allocation without time-synced groups or decoupled prompt and generation tasks.

A request is admitted with KV for its whole predicted sequence (prompt plus predicted output
times ``1 + padding_ratio``, as ``econoserve`` sizes a GT), so a correct prediction never meets
an allocation failure. After each iteration, while GPU (the token budget) and KV (free blocks)
are left, the queued request whose demands, prompt tokens and allocation blocks, are nearest
(Euclidean distance, each resource as a share of its capacity) to what is available is
admitted, and the search repeats: O(n^2) in the queue length, the scheduling cost the paper
measures (34% of JCT). ``max_candidates`` bounds the scan per pick; the paper scans the whole
queue. Running requests decode every iteration; one that outgrows its allocation grows
into free blocks, and when none are free the most recently admitted request is recomputed
(vLLM's victim order), as the paper's MultiRes has no reserve or offload-free preemption.

Nothing bounds a request's wait: the nearest-demand pick may pass over a large request for as
long as smaller ones keep arriving (the paper's MultiRes has no such bound either).
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from services.scheduler.output import Budget, SchedulerOutput
from services.scheduler.policies.econo_sizing import LengthModel
from services.scheduler.policies.fcfs import FcfsPolicy
from services.scheduler.policy import PolicyConfig
from services.scheduler.request import Request, RequestStatus
from services.scheduler.state import SchedulerState

_RUNNING = RequestStatus.RUNNING


@dataclass(frozen=True)
class MultiResConfig(PolicyConfig):
    padding_ratio: float = 0.15         # as econoserve: exact allocation plus padding
    use_upper_quantile: bool = False
    calibrated_padding: bool = True     # as econoserve: no further than the upper quantile
    default_output_len: int = 128       # until a prediction arrives
    max_candidates: int = 512           # queued requests scanned per pick
    # Read by the shared length model (deadlines are not used by MultiRes).
    slo_scale: float = 2.0
    prefill_s_per_token: float = 0.0005
    decode_s_per_token: float = 0.02
    learn_timings: bool = False


class MultiResPolicy(FcfsPolicy):
    name = "multires"
    config_class = MultiResConfig

    def __init__(self, config, policy_config=None):
        super().__init__(config, policy_config)
        o = self.options
        if o.padding_ratio < 0 or o.max_candidates < 1 or o.default_output_len < 1:
            raise ValueError("multires: padding_ratio >= 0, max_candidates and "
                             "default_output_len >= 1")
        self.model = LengthModel(o, config, 0)
        self.num_picks = 0                  # requests admitted by the distance search

    def counters(self) -> dict[str, float]:
        return {"num_picks": self.num_picks}

    def schedule(self, state: SchedulerState, budget: Budget) -> SchedulerOutput:
        output = state.new_output()
        tokens = self._decodes(state, output, budget.max_num_batched_tokens)
        self._admit(state, output, tokens, budget)
        return output

    def _decodes(self, state: SchedulerState, output: SchedulerOutput, tokens: int) -> int:
        bm, running = state.block_manager, state.running
        for req in list(running.values()):
            if tokens <= 0:
                break
            if req.status is not _RUNNING:
                continue                    # recomputed for an earlier request of this loop
            while not bm.allocate_slots(req.request_id, req.num_tokens):
                victim = next(reversed(running.values()))      # under-provisioned
                state.preempt(victim, output)
                self.waiting.appendleft(victim)
                if victim is req:
                    break
            if req.status is _RUNNING:
                n = req.num_tokens - req.num_computed_tokens
                output.add(req, n)
                tokens -= n
        return tokens

    def _nearest(self, bm, tokens: int, budget: Budget, first: bool) -> Request | None:
        """The queued request whose (prompt tokens, allocation blocks) is nearest to the
        (tokens, blocks) available; a prompt larger than the budget only as the first."""
        free, best, best_d = bm.num_free_blocks, None, math.inf
        for req in itertools.islice(self.waiting, self.options.max_candidates):
            n = req.num_tokens - req.num_computed_tokens
            blocks = bm.blocks_for(self.model.target_tokens(req)) - bm.num_blocks_of(
                req.request_id)
            if blocks > free or (n > tokens and not first):
                continue
            d = math.hypot((tokens - n) / budget.max_num_batched_tokens,
                           (free - blocks) / bm.num_blocks)
            if d < best_d:
                best, best_d = req, d
        return best

    def _admit(self, state: SchedulerState, output: SchedulerOutput, tokens: int,
               budget: Budget) -> None:
        bm = state.block_manager
        while self.waiting and tokens > 0 and len(state.running) < budget.max_num_seqs:
            req = self._nearest(bm, tokens, budget, first=not output.scheduled)
            if req is None:
                return
            start = state.prefix_start(req)
            if not state.admit(req, self.model.target_tokens(req)):
                return
            self.waiting.remove(req)
            self.num_picks += 1
            n = req.num_tokens - start
            output.add(req, n)
            tokens -= n
