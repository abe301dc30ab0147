"""The scheduler core: validates arrivals, runs the policy once per iteration, turns its
decision into one ``ExecutorInput`` and folds the executor's result back into request state.

Pure and deterministic: the caller passes ``now``; nothing here reads a clock."""
from __future__ import annotations

from dataclasses import dataclass

from lenserve_contract.sampling_params import InvalidRequestError
from services.executor.types import ExecutorInput, ExecutorOutput, ScheduledSequence
from services.scheduler.config import SchedulerConfig
from services.scheduler.output import Budget, SchedulerOutput
from services.scheduler.policy import Policy
from services.scheduler.request import FinishReason, Request, RequestStatus
from services.scheduler.state import SchedulerState


@dataclass(frozen=True)
class SchedulerStats:
    policy: str
    num_waiting: int          # queued for admission: new, preempted or swapped
    num_running: int
    num_preempted: int        # currently preempted (recompute) or swapped
    num_free_blocks: int
    num_total_blocks: int
    num_iterations: int
    num_finished: int
    num_preemptions: int      # preemptions so far


class Scheduler:
    def __init__(self, config: SchedulerConfig, policy: Policy | None = None):
        if policy is None:
            from services.scheduler.policies import make_policy
            policy = make_policy(config.policy, config)
        self.config = config
        self.policy = policy
        self.state = SchedulerState(config)
        self._budget = Budget(config.max_num_batched_tokens, config.max_num_seqs)

    @property
    def block_manager(self):
        return self.state.block_manager

    def add_request(self, request: Request) -> None:
        """Queue a request, or raise InvalidRequestError (nothing else changes)."""
        self._validate(request)
        self.state.add(request)
        self.policy.add_request(request)

    def _validate(self, request: Request) -> None:
        cfg, n = self.config, request.num_prompt_tokens
        if request.request_id in self.state.requests:
            raise InvalidRequestError(f"request id {request.request_id!r} is already in use",
                                      field="request_id")
        if n == 0:
            raise InvalidRequestError("prompt is empty", field="prompt")
        if n >= cfg.max_model_len:
            raise InvalidRequestError(
                f"prompt has {n} tokens but the maximum context length is {cfg.max_model_len}, "
                "leaving no room for output", field="prompt", code="prompt_too_long")

    def abort_request(self, request_id: str) -> Request | None:
        request = self.state.requests.get(request_id)
        if request is not None:
            self.finish_request(request, FinishReason.ABORT)
        return request

    def finish_request(self, request: Request, reason: FinishReason,
                       stop_reason: int | str | None = None) -> None:
        """End a request from outside the token loop (abort, stop string, error)."""
        if request.is_finished:
            return
        self.policy.remove_request(request)
        request.stop_reason = stop_reason
        self.state.finish(request, reason)

    def has_unfinished_requests(self) -> bool:
        return bool(self.state.requests)

    def schedule(self, now: float) -> SchedulerOutput:
        state = self.state
        state.now = now
        output = self.policy.schedule(state, self._budget)
        state.iteration += 1
        for request, _ in output.scheduled:
            if request.metrics.first_scheduled_time is None:
                request.metrics.first_scheduled_time = now
        return output

    def make_executor_input(self, output: SchedulerOutput) -> ExecutorInput:
        table_of = self.state.block_manager.block_table
        seqs = []
        for req, n in output.scheduled:
            start = req.num_computed_tokens
            end = start + n
            seqs.append(ScheduledSequence(
                req.request_id, req.token_ids[start:end], start, list(table_of(req.request_id)),
                end == len(req.token_ids), req.sampling_params, len(req.token_ids) - req.num_prompt_tokens))
        return ExecutorInput(iteration=output.iteration, sequences=seqs)

    def update_from_output(self, output: SchedulerOutput, result: ExecutorOutput,
                           now: float) -> list[Request]:
        """Advance computed tokens, append sampled tokens, finish requests that hit a stop
        condition. Returns the requests that got a token or finished."""
        self.state.now = now
        sampled = result.sampled
        updated = []
        for req, n in output.scheduled:
            if req.status is not RequestStatus.RUNNING:
                continue    # aborted while the iteration ran
            req.num_computed_tokens += n
            if req.num_computed_tokens < len(req.token_ids):
                continue    # a prefill chunk that does not end the prompt samples nothing
            token = sampled.get(req.request_id)
            if token is None:
                req.error = f"executor returned no token for iteration {output.iteration}"
                self.finish_request(req, FinishReason.ERROR)
            else:
                self._append_token(req, token, now)
            updated.append(req)
        self.policy.update(output, updated)
        return updated

    def _append_token(self, req: Request, token: int, now: float) -> None:
        req.token_ids.append(token)
        metrics = req.metrics
        if metrics.first_token_time is None:
            metrics.first_token_time = now
        metrics.token_times.append(now)
        reason, stop_reason = self._stop_condition(req, token)
        if reason is not None:
            self.finish_request(req, reason, stop_reason)

    def _stop_condition(self, req: Request, token: int) -> tuple[FinishReason | None, int | None]:
        params = req.sampling_params
        num_out = len(req.token_ids) - req.num_prompt_tokens
        if num_out >= params.min_tokens:
            if token == req.eos_token_id and not params.ignore_eos:
                return FinishReason.STOP, None
            if token in params.stop_token_ids:
                return FinishReason.STOP, token
        if num_out >= params.max_tokens or len(req.token_ids) >= self.config.max_model_len:
            return FinishReason.LENGTH, None
        return None, None

    def stats(self) -> SchedulerStats:
        state, counts = self.state, self.state.counts
        return SchedulerStats(
            policy=self.policy.name, num_waiting=state.num_queued(),
            num_running=counts[RequestStatus.RUNNING],
            num_preempted=counts[RequestStatus.PREEMPTED] + counts[RequestStatus.SWAPPED],
            num_free_blocks=state.block_manager.num_free_blocks,
            num_total_blocks=self.config.num_gpu_blocks, num_iterations=state.iteration,
            num_finished=state.num_finished, num_preemptions=state.num_preemptions)

    def check_integrity(self) -> None:
        self.state.check_integrity()
