"""The scheduler core: validates arrivals, runs the policy once per iteration, turns its
decision into one ``ExecutorInput`` and folds the executor's result back into request state.

Pure and deterministic: the caller passes ``now``; nothing here reads a clock."""
from __future__ import annotations

from dataclasses import dataclass

from lenserve_contract.errors import InvalidRequestError
from services.executor.types import ExecutorInput, ExecutorOutput, ScheduledSequence
from services.scheduler.config import SchedulerConfig
from services.scheduler.output import SchedulerOutput
from services.scheduler import prefix_host
from services.scheduler.policy import Policy
from services.scheduler.request import FinishReason, Prediction, Request, RequestStatus
from services.scheduler.state import SchedulerState

_RUNNING = RequestStatus.RUNNING


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
    num_swapped: int = 0      # requests whose KV is on the host tier
    num_free_host_blocks: int = 0
    num_host_blocks: int = 0
    # Filled by the serving core from its prediction pump (zero without a predictor).
    num_predictions: int = 0              # length predictions made (defaults included)
    num_completions_reported: int = 0     # completion records handed on (observe or Kafka)
    num_completions_dropped: int = 0      # records lost before that (queue full, report failed)
    # The Kafka publisher's buffer (zero unless a bootstrap server is set).
    num_kafka_published: int = 0          # records Kafka acknowledged
    num_kafka_buffered: int = 0           # records waiting for Kafka now
    num_kafka_dropped: int = 0            # oldest records dropped because the buffer was full
    # Prefix caching: prompt tokens looked up at admissions, and those served from the cache.
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    num_cached_blocks: int = 0            # device blocks whose KV is indexed
    prefix_cache_host_hits: int = 0       # of the hits, tokens uploaded from the host tier
    num_host_cached_blocks: int = 0       # host blocks the prefix cache holds

    @property
    def prefix_cache_hit_rate(self) -> float:
        return self.prefix_cache_hits / self.prefix_cache_queries if self.prefix_cache_queries else 0.0
    # Filled by the serving core: swap-ins an iteration waited for before it ran (uploads the
    # policy did not issue ahead of need), and uploads issued ahead (overlapping an iteration).
    num_upload_waits: int = 0
    num_uploads_ahead: int = 0


class Scheduler:
    def __init__(self, config: SchedulerConfig, policy: Policy | None = None, *,
                 num_host_blocks: int = 0, copies_overlap: bool = True):
        if policy is None:
            from services.scheduler.policies import make_policy
            policy = make_policy(config.policy, config, list(config.policy_config))
        self.config = config
        self.policy = policy
        self.state = SchedulerState(config, num_host_blocks, copies_overlap)
        self.state.swap_outs_before_forward = policy.swap_outs_before_forward
        # Block tables the executor holds: request id -> (table epoch, blocks sent).
        self._sent: dict[str, tuple[int, int]] = {}
        self._forget: list[str] = []
        # The requests the last update_from_output finished (a caller that reports finished
        # requests only reads them here instead of filtering every updated request).
        self.finished_in_update: list[Request] = []

    @property
    def block_manager(self):
        return self.state.block_manager

    def add_request(self, request: Request) -> None:
        """Queue a request, or raise InvalidRequestError (nothing else changes)."""
        self.validate(request)
        request.fix_stop_conditions(self.config.max_model_len)
        self.state.add(request)
        self.state.cached_tokens(request, tiers=True)     # what the policy ranks it by
        self.policy.add_request(request)

    def validate(self, request: Request) -> None:
        """Raise InvalidRequestError if ``add_request`` would refuse ``request``."""
        cfg, n = self.config, request.num_prompt_tokens
        if request.request_id.startswith(prefix_host.HOST_OWNER[0]):
            raise InvalidRequestError("a request id may not start with \\x1f (reserved)",
                                      field="request_id")
        if request.request_id in self.state.requests:
            raise InvalidRequestError(f"request id {request.request_id!r} is already in use",
                                      field="request_id")
        if n == 0:
            raise InvalidRequestError("prompt is empty", field="prompt")
        if n >= cfg.max_model_len:
            raise InvalidRequestError(
                f"prompt has {n} tokens but the maximum context length is {cfg.max_model_len}, "
                "leaving no room for output", field="prompt", code="prompt_too_long")

    def set_prediction(self, request_id: str, prediction: Prediction) -> Request | None:
        """A prediction arrived for a request (maybe long after it was queued). Returns the
        request, or None if it already finished."""
        request = self.state.requests.get(request_id)
        if request is not None:
            request.prediction = prediction
            request.metrics.predicted_output_len = prediction.length
            request.metrics.prediction_source = prediction.source
            self.policy.on_prediction(request, prediction)
        return request

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
        self._drop_table(request.request_id)

    def has_unfinished_requests(self) -> bool:
        return bool(self.state.requests)

    def schedule(self, now: float) -> SchedulerOutput:
        state = self.state
        state.now = now
        if state.pinned_at:
            prefix_host.expire_pins(state)
        output = self.policy.schedule(state, state.budget)
        if state.prefix_uploads:            # issued by the policy's picks (``prefix_start``)
            output.prefix_uploads.extend(state.prefix_uploads)
            state.prefix_uploads.clear()
        state.iteration += 1
        for request in output.preempted:
            self._drop_table(request.request_id)
        for rid, _ in output.swapped_out:
            self._drop_table(rid)
        return output

    def release_swapped_blocks(self, in_flight: int = 0) -> None:
        """The iteration's swap copies have finished: the device blocks swap-outs read and the
        host blocks swap-ins read may be handed out again, but for ``in_flight`` host blocks of
        swap-ins that land in the background."""
        self.state.release_swapped(in_flight)

    def resend_block_tables(self) -> None:
        """Send whole tables from the next iteration on: the executor may have lost its copy
        (a failed call, or a restarted executor process)."""
        self._sent.clear()
        self._forget.clear()

    def _drop_table(self, request_id: str) -> None:
        if self._sent.pop(request_id, None) is not None:
            self._forget.append(request_id)

    def make_executor_input(self, output: SchedulerOutput,
                            host_tables: dict[str, list[int]] | None = None) -> ExecutorInput:
        """``host_tables``: the host blocks of each streamed request (``output.streamed``)."""
        bm, sent_tables = self.state.block_manager, self._sent
        streamed = output.streamed
        table_of, epoch_of = bm.block_table, bm.epoch
        seqs = []
        # One pass with everything in locals: this runs for every request on every iteration.
        for req, n in output.scheduled:
            rid, tokens = req.request_id, req.token_ids
            start = req.num_computed_tokens
            end = start + n
            if streamed and rid in streamed:
                seqs.append(ScheduledSequence(rid, tokens[start:end], start, [],
                                              end == len(tokens), req.sampling_params,
                                              len(tokens) - req.num_prompt_tokens,
                                              host_block_table=list(host_tables[rid])))
                continue
            table, epoch = table_of(rid), epoch_of(rid)
            sent = sent_tables.get(rid)
            # Only blocks appended since the last call travel, unless the table was rewritten.
            if sent is not None and sent[0] == epoch:
                blocks, delta = table[sent[1]:], True
                if blocks:
                    sent_tables[rid] = (epoch, len(table))
            else:
                blocks, delta = list(table), False
                sent_tables[rid] = (epoch, len(table))
            seqs.append(ScheduledSequence(rid, tokens[start:end], start, blocks,
                                          end == len(tokens), req.sampling_params,
                                          len(tokens) - req.num_prompt_tokens, delta))
            if not delta and start and req.sampling_params.needs_history:
                seqs[-1].context_token_ids = tokens[:start]   # the executor rebuilds from it
        forget, self._forget = self._forget, []
        return ExecutorInput(iteration=output.iteration, sequences=seqs,
                             finished_request_ids=forget, waves=output.waves)

    def update_from_output(self, output: SchedulerOutput, result: ExecutorOutput,
                           now: float) -> list[Request]:
        """Advance computed tokens, append sampled tokens, finish requests that hit a stop
        condition. Returns the requests that got a token or finished."""
        self.state.now = now
        sampled = result.sampled
        updated = []
        self.finished_in_update = finished = []
        # Runs for every scheduled request on every iteration: one pass, everything in locals.
        running, token_of, add = _RUNNING, sampled.get, updated.append
        bm = self.state.block_manager
        # Blocks that just filled with computed tokens join the prefix cache.
        cache, bs = (bm.cache_computed, bm.block_size) if bm.prefix is not None else (None, 1)
        streamed = output.streamed
        for req, n in output.scheduled:
            if req.status is not running and not (streamed and req.request_id in streamed
                                                  and not req.is_finished):
                continue    # aborted while the iteration ran
            computed = req.num_computed_tokens + n
            req.num_computed_tokens = computed
            tokens = req.token_ids
            if cache is not None and computed // bs != (computed - n) // bs:
                cache(req.request_id, tokens, computed)
            if computed < len(tokens):
                continue    # a prefill chunk that does not end the prompt samples nothing
            token = token_of(req.request_id)
            if token is None:
                req.error = f"executor returned no token for iteration {output.iteration}"
                self.finish_request(req, FinishReason.ERROR)
                add(req)
                finished.append(req)
                continue
            tokens.append(token)
            metrics = req.metrics
            if metrics.first_token_time is None:
                metrics.first_token_time = now
            metrics.token_times.append(now)
            if token in req.stop_candidates:
                reason, stop_reason = self._stop_condition(req, token)
                if reason is not None:
                    self.finish_request(req, reason, stop_reason)
                    finished.append(req)
            elif computed >= req.token_limit - 1:
                # All tokens were computed and one was appended: what _stop_condition decides
                # for a token that stops nothing by itself (max_tokens, the context limit, or
                # a replayed trace's reply length).
                self.finish_request(req, FinishReason.STOP if req.ends_as_traced
                                    else FinishReason.LENGTH)
                finished.append(req)
            add(req)
        self.policy.update(output, updated, result)
        return updated

    def _stop_condition(self, req: Request, token: int) -> tuple[FinishReason | None, int | None]:
        params = req.sampling_params
        num_out = len(req.token_ids) - req.num_prompt_tokens
        if num_out >= params.min_tokens:
            if token in req.eos_token_ids and not params.ignore_eos:
                return FinishReason.STOP, None
            if token in params.stop_token_ids:
                return FinishReason.STOP, token
        if len(req.token_ids) >= req.token_limit:     # max_tokens, or the context limit
            return (FinishReason.STOP if req.ends_as_traced else FinishReason.LENGTH), None
        return None, None

    def stats(self) -> SchedulerStats:
        state, counts = self.state, self.state.counts
        return SchedulerStats(
            policy=self.policy.name, num_waiting=state.num_queued(),
            num_running=counts[RequestStatus.RUNNING],
            num_preempted=counts[RequestStatus.PREEMPTED] + counts[RequestStatus.SWAPPED],
            num_free_blocks=state.block_manager.num_free_blocks,
            num_total_blocks=self.config.num_gpu_blocks, num_iterations=state.iteration,
            num_finished=state.num_finished, num_preemptions=state.num_preemptions,
            num_swapped=counts[RequestStatus.SWAPPED],
            num_free_host_blocks=state.num_free_host_blocks,
            num_host_blocks=state.num_host_blocks,
            prefix_cache_queries=state.prefix_query_tokens,
            prefix_cache_hits=state.prefix_hit_tokens,
            num_cached_blocks=len(state.block_manager.prefix or ()),
            prefix_cache_host_hits=state.prefix_host_hit_tokens,
            num_host_cached_blocks=len(state.prefix_host or ()))

    def check_integrity(self) -> None:
        self.state.check_integrity()
