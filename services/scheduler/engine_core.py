"""The serving core: schedule -> KV moves -> execute -> update -> outputs, one iteration per
``step()``.

Its parts are injected: an ``Executor`` (in-process model, gRPC client or cost model), an
optional ``LengthPredictor`` (through a ``PredictionPump``, off the loop) and an optional
``KVManager`` (the host tier). ``lenserve.LLM``, ``AsyncEngine`` and the gRPC scheduler
service are fronts on this one loop. The core reads the clock it is given, tokenizes,
detokenizes and applies stop strings (which need text, so they cannot live in the
token-level scheduler)."""
from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable

from lenserve_contract.errors import InvalidRequestError
from lenserve_contract.outputs import CompletionOutput, Logprob, RequestOutput
from lenserve_contract.sampling_params import SamplingParams
from services.executor.interface import Executor, ExecutorUnavailableError, StreamError
from services.executor.types import ExecutorOutput
from services.kvmanager.interface import KVManager
from services.predictor.interface import PredictQuery
from services.predictor.types import Completion
from services.scheduler.config import SchedulerConfig
from services.scheduler.detokenizer import IncrementalDetokenizer
from services.scheduler.engine_swaps import EngineSwaps
from services.scheduler.grammar_gate import GrammarGate
from services.scheduler.output import SchedulerOutput
from services.scheduler.parallel import Group, ParallelGroups, child_id, child_params, shared_tokens
from services.scheduler.params_check import (
    check_length,
    check_params,
    prompt_tokens,
    truncate_prompt,
)
from services.scheduler.predictions import PredictionPump
from services.scheduler.prefix_moves import PrefixMoves
from services.scheduler.profile import StepProfile
from services.scheduler.request import FinishReason, Request
from services.scheduler.scheduler import Scheduler, SchedulerStats
from services.scheduler.streams import disable_streaming, prepare_streams, setup_streaming

logger = logging.getLogger(__name__)


class _Stream:
    """Engine-side state of one request: its text and what was already reported."""

    __slots__ = ("delta", "detok", "logprobs", "num_sent", "prompt", "request")

    def __init__(self, request: Request, prompt: str | None, detok: IncrementalDetokenizer,
                 delta: bool):
        self.request, self.prompt, self.detok, self.delta = request, prompt, detok, delta
        self.num_sent = 0
        # One per output token, when the request asked for logprobs.
        self.logprobs: list[Logprob] | None = (
            None if request.sampling_params.logprobs is None else [])


class EngineCore:
    def __init__(self, scheduler_config: SchedulerConfig, executor: Executor, *, tokenizer=None,
                 predictions: PredictionPump | None = None, kv_manager: KVManager | None = None,
                 clock: Callable[[], float] = time.monotonic, check_integrity: bool = False,
                 finished_outputs_only: bool = False, time_model=None):
        self.executor = executor
        self.tokenizer = tokenizer if tokenizer is not None else getattr(executor, "tokenizer", None)
        self.model_info = executor.model_info()
        self.kv_manager = kv_manager
        host_blocks = kv_manager.num_host_blocks if kv_manager is not None else 0
        self.scheduler = Scheduler(scheduler_config, num_host_blocks=host_blocks,
                                   copies_overlap=kv_manager is None or kv_manager.copies_overlap)
        self.predictions = predictions
        self.clock = clock
        self.check_integrity = check_integrity
        # A caller that only reads final outputs (the simulator) skips building one output
        # per request per iteration; tokens and timings still accumulate on the request.
        if finished_outputs_only and self.tokenizer is not None:
            raise ValueError("finished_outputs_only skips detokenizing and stop strings: "
                             "it is for engines without a tokenizer")
        self.finished_outputs_only = finished_outputs_only
        # An in-process executor that only times a batch (the simulator's cost model) may read
        # the scheduler's plan itself through ``execute_scheduled(iteration, scheduled)``: it
        # needs no token ids or block tables, and building one ScheduledSequence per request
        # per iteration was most of a simulated run's time. It must not change the requests.
        self._execute_scheduled = getattr(executor, "execute_scheduled", None)
        self._streams: dict[str, _Stream] = {}
        self.groups = ParallelGroups()      # requests with n > 1
        self.prefix_moves = (PrefixMoves(self.scheduler.state, kv_manager)
                             if self.scheduler.state.prefix_host is not None else None)
        # The KV copies, waited for only where an iteration needs them (engine_swaps.py).
        self.swaps = EngineSwaps(self.scheduler, kv_manager, self._fail_request,
                                 self.prefix_moves)
        self.last_step_empty = False
        self.profile = StepProfile()
        # An ``ExecutionTimeModel fed every executed iteration, for a replica's load report
        # (a router places by it); None: only a policy that owns one fits it.
        self.time_model = time_model
        self.grammar_gate = (GrammarGate(executor.compile_grammar)
                             if getattr(executor, "compiles_grammars", False) else None)
        setup_streaming(self.scheduler.state, executor, kv_manager,
                        getattr(self.scheduler.policy.options, "stream_mode", "link"))

    # -- requests ---------------------------------------------------------------------------
    def add_request(self, request_id: str, prompt: str | None = None,
                    prompt_token_ids: list[int] | None = None,
                    sampling_params: SamplingParams | None = None,
                    arrival_time: float | None = None, *, delta: bool = False,
                    predicted_output_len: int | None = None, priority: int = 0,
                    slo_deadline_s: float | None = None,
                    true_output_len: int | None = None) -> None:
        """Queue a request. Bad input raises InvalidRequestError and changes nothing.
        ``delta``: outputs carry only new tokens and text (streaming) instead of all so far.
        ``predicted_output_len`` skips the predictor; ``true_output_len``, a replayed trace's
        reply length, ends the request there as the model's EOS would and feeds the oracle
        predictor (no policy sees it)."""
        if not isinstance(request_id, str) or not request_id:
            raise InvalidRequestError("request_id must be a non-empty string", field="request_id")
        params = sampling_params if sampling_params is not None else SamplingParams()
        if not isinstance(params, SamplingParams):
            raise InvalidRequestError(f"sampling_params must be SamplingParams, got "
                                      f"{type(params).__name__}", field="sampling_params")
        params.verify()
        check_params(params, self.model_info.vocab_size, self.tokenizer)
        limit = self.scheduler.config.max_model_len
        token_ids = truncate_prompt(prompt_tokens(prompt, prompt_token_ids, self.tokenizer,
                                                  self.model_info), params, limit)
        check_length(len(token_ids), params, limit)
        arrival = self.clock() if arrival_time is None else arrival_time
        ids = [request_id] if params.n == 1 else [child_id(request_id, i) for i in range(params.n)]
        taken = self.scheduler.state.requests
        if self.groups.owns(request_id) or (params.n > 1 and any(
                r in taken or self.groups.owns(r) for r in (request_id, *ids))):
            raise InvalidRequestError(f"request id {request_id!r} is already in use",
                                      field="request_id")
        requests = [Request(rid, token_ids, params if params.n == 1 else child_params(params, i),
                            arrival, eos_token_id=(self.model_info.eos_token_ids
                                                  or self.model_info.eos_token_id),
                            predicted_output_len=predicted_output_len, priority=priority,
                            slo_deadline_s=slo_deadline_s, true_output_len=true_output_len)
                    for i, rid in enumerate(ids)]
        self._enqueue(requests[0])     # may refuse: nothing changed yet
        if params.n > 1:
            bm = self.scheduler.block_manager
            group = Group(request_id, requests, shared_tokens(
                len(token_ids), bm.block_size, bm.prefix is not None), delta)
            for child in requests[1:]:
                if child not in group.held:
                    self._enqueue(child)
            self.groups.add(group)
        for request in requests:
            detok = IncrementalDetokenizer(self.tokenizer, token_ids, params.stop)
            self._streams[request.request_id] = _Stream(request, prompt, detok, delta)
        if predicted_output_len is None and self.predictions is not None:
            text = prompt if prompt is not None else self._decode(token_ids)
            self.predictions.submit(ids[0], PredictQuery(text, params.max_tokens,
                                                         true_output_len))

    def _decode(self, token_ids: list[int]) -> str:
        if self.tokenizer is None:
            return ""
        return self.tokenizer.decode(token_ids, skip_special_tokens=True)

    def abort_request(self, request_id: str) -> RequestOutput | None:
        """Abort a request (with ``n > 1``: every sample of it); returns its final output, or
        None if it is unknown or finished."""
        group = self.groups.by_parent.get(request_id)
        if group is not None:
            self.groups.release_ready(self._enqueue, everything_of=request_id)
        ids = [request_id] if group is None else [c.request_id for c in group.children]
        if self.grammar_gate is not None:     # held while compiling: queue it to abort it
            for rid in ids:
                self.grammar_gate.remove_into(self.scheduler, rid)
        if group is not None:
            outs = [self._make_output(r) for r in map(self.scheduler.abort_request, ids)
                    if r is not None]
            merged = self.groups.merge(outs)
            return merged[0] if merged else None
        request = self.scheduler.abort_request(request_id)
        if request is None:
            return None
        return self._make_output(request)

    def has_unfinished_requests(self) -> bool:
        return (self.scheduler.has_unfinished_requests() or self.groups.num_held > 0
                or bool(self.grammar_gate))

    def get_num_unfinished_requests(self) -> int:
        return (len(self.scheduler.state.requests) + self.groups.num_held
                + len(self.grammar_gate or ()))

    def stats(self) -> SchedulerStats:
        stats = dataclasses.replace(self.scheduler.stats(),
                                    num_upload_waits=self.swaps.num_upload_waits,
                                    num_uploads_ahead=self.swaps.num_uploads_ahead)
        if self.predictions is None:
            return stats
        return dataclasses.replace(stats, **self.predictions.counters())

    # -- the loop ---------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Run one iteration. Returns outputs for requests that got tokens or finished (one
        per request: the samples of an ``n > 1`` request merged into it)."""
        outputs = []
        if self.grammar_gate is not None:
            outputs = [f for f in (self._fail_request(r.request_id, why) for r, why
                                   in self.grammar_gate.release_into(self.scheduler))
                       if f is not None]
        outputs += self._step()
        if self.groups.by_parent:
            outputs = self.groups.merge(outputs)
            self.groups.release_ready(self._enqueue)
        return outputs

    def _enqueue(self, request: Request) -> None:
        """Queue ``request`` in the scheduler, or hold it while its grammar compiles."""
        if self.grammar_gate is None:
            self.scheduler.add_request(request)
        else:
            self.grammar_gate.add(self.scheduler, request)

    def _step(self) -> list[RequestOutput]:
        scheduler = self.scheduler
        t0 = time.perf_counter()
        self._before_schedule()
        out = scheduler.schedule(self.clock())
        # Whether the iteration had nothing to run or move (a caller in virtual time tells a
        # stalled engine from one whose copies land in the background by it).
        self.last_step_empty = out.is_empty and not self.swaps.uploads
        if out.is_empty:
            if self.grammar_gate and not scheduler.has_unfinished_requests():
                self.grammar_gate.wait(0.05)    # only compiles pending: no busy loop
            # Nothing to run: let the uploads in flight land (a virtual clock moves to them).
            return self.swaps.drain()
        t1 = time.perf_counter()
        failed = self.swaps.start(out)
        hosts = (prepare_streams(scheduler.state, self.kv_manager, out) if out.streamed
                 else None)
        t2 = time.perf_counter()
        try:
            result = (self._execute(out, hosts) if out.scheduled
                      else ExecutorOutput(out.iteration, {}))
        except StreamError as exc:
            # Nothing advanced: the iteration is run again without streaming next step.
            disable_streaming(scheduler.state, str(exc))
            scheduler.resend_block_tables()
            scheduler.state.settle_streams()
            return failed + self.swaps.finish()
        except Exception as exc:
            if isinstance(exc, ExecutorUnavailableError):
                logger.error("iteration %d failed: %s", out.iteration, exc)
            else:
                logger.exception("iteration %d failed", out.iteration)
            self.scheduler.resend_block_tables()
            # The KV pool may be gone with the executor: serve nothing from it again.
            self.scheduler.block_manager.reset_prefix_cache()
            failed += self.swaps.finish()
            failed += self._fail_batch(out, exc)
            scheduler.state.settle_streams()
            return failed
        t3 = time.perf_counter()
        failed += self.swaps.finish()
        updated = scheduler.update_from_output(out, result, self.clock())
        if result.top_logprobs:
            self._record_logprobs(result)
        if self.time_model is not None:     # after the update, as a policy's own model sees it
            self.time_model.observe_iteration(out, result)
        if self.prefix_moves is not None:   # blocks next to be evicted copy out meanwhile
            self.prefix_moves.write_back()
        scheduler.state.settle_streams()
        if self.finished_outputs_only:
            updated = scheduler.finished_in_update
        outputs = failed + [self._make_output(r) for r in updated]
        if self.check_integrity:
            self._check_integrity()
        t4 = time.perf_counter()
        self.profile.add(t1 - t0, t3 - t2, result.timings, t4 - t3, t4 - t0, kv_s=t2 - t1)
        if self.predictions is not None:
            self.profile.predictor_s = self.predictions.busy_s
        return outputs

    def _record_logprobs(self, result: ExecutorOutput) -> None:
        for rid, top in result.top_logprobs.items():
            stream = self._streams.get(rid)
            # A request aborted while the iteration ran did not take its token.
            if stream is not None and len(stream.logprobs) < stream.request.num_output_tokens:
                stream.logprobs.append(Logprob(result.sampled[rid], result.logprobs[rid], top))

    def _execute(self, out: SchedulerOutput, hosts: dict[str, list[int]] | None = None
                 ) -> ExecutorOutput:
        if self._execute_scheduled is not None:
            return self._execute_scheduled(out.iteration, out.scheduled)
        return self.executor.execute(self.scheduler.make_executor_input(out, hosts))

    def _before_schedule(self) -> None:
        if self.prefix_moves is not None:   # landed write-backs need no abandoning if evicted
            self.prefix_moves.poll()
        if self.predictions is None:
            return
        gate = self.grammar_gate
        for rid, prediction in self.predictions.drain():
            if gate is None or not gate.hold_prediction(rid, prediction):
                self.scheduler.set_prediction(rid, prediction)
            for child in self.groups.siblings(rid):     # one prediction for all n samples
                if gate is not None and gate.hold_prediction(child.request_id, prediction):
                    continue
                if self.scheduler.set_prediction(child.request_id, prediction) is None:
                    child.prediction = prediction

    def _fail_request(self, request_id: str, why: str) -> RequestOutput | None:
        request = self.scheduler.state.requests.get(request_id)
        if request is None:
            return None
        request.error = why
        self.scheduler.finish_request(request, FinishReason.ERROR)
        return self._make_output(request)

    def _check_integrity(self) -> None:
        self.scheduler.check_integrity()
        if self.kv_manager is not None:
            self.kv_manager.check_integrity()
            swapped = {rid for rid, r in self.scheduler.state.requests.items()
                       if r.status.value == "swapped"}
            assert all(self.kv_manager.holds(rid) for rid in swapped), "swapped KV not on host"
            if self.prefix_moves is not None:
                self.prefix_moves.check()

    def _fail_batch(self, out: SchedulerOutput, exc: Exception) -> list[RequestOutput]:
        failed = []
        for request, _ in out.scheduled:
            if not request.is_finished:
                request.error = f"executor failed: {exc}"
                self.scheduler.finish_request(request, FinishReason.ERROR)
                failed.append(self._make_output(request))
        return failed

    def _make_output(self, request: Request) -> RequestOutput:
        stream = self._streams[request.request_id]
        new_tokens = request.token_ids[request.num_prompt_tokens + stream.num_sent:]
        # Without a tokenizer there is no text (a simulator, a token-ids client): no
        # detokenizing, and no stop strings to match.
        detokenize = self.tokenizer is not None and request.sampling_params.detokenize
        if new_tokens and detokenize:
            stop = stream.detok.add_tokens(new_tokens)
            if stop is not None:
                self.scheduler.finish_request(request, FinishReason.STOP, stop)
        finished = request.is_finished
        start = stream.num_sent if stream.delta else 0
        stream.num_sent += len(new_tokens)
        text = ("" if not detokenize else stream.detok.take_delta(finished) if stream.delta
                else stream.detok.visible_text(finished))
        completion = CompletionOutput(
            index=0, text=text, token_ids=request.output_token_ids[start:],
            finish_reason=request.finish_reason.value if finished else None,
            stop_reason=request.stop_reason,
            logprobs=None if stream.logprobs is None else stream.logprobs[start:])
        if finished:
            del self._streams[request.request_id]
            self._on_finished(request, stream)
        return RequestOutput(request.request_id, stream.prompt, request.prompt_token_ids,
                             [completion], finished, request.metrics, request.error)

    def _on_finished(self, request: Request, stream: _Stream) -> None:
        if self.kv_manager is not None:
            self._free_host_copy(request.request_id)
        if self.predictions is None or request.finish_reason not in (FinishReason.STOP,
                                                                     FinishReason.LENGTH):
            return
        prompt = stream.prompt if stream.prompt is not None else self._decode(
            request.prompt_token_ids)
        if prompt:
            self.predictions.report(Completion(
                self.predictions.model, prompt, request.num_output_tokens, request.request_id,
                request.metrics.finished_time or 0.0, request.predicted_output_len or 0))

    def _free_host_copy(self, request_id: str) -> None:
        try:
            if self.kv_manager.holds(request_id):
                self.kv_manager.free(request_id)
        except Exception as exc:  # a kvmanager that is down: the request ends all the same
            logger.error("could not free the host KV of %s: %s", request_id, exc)

    def close(self) -> None:
        self.swaps.drain()
        if self.predictions is not None:
            self.predictions.close()
        if self.kv_manager is not None:
            self.kv_manager.close()
        if self.grammar_gate is not None:
            self.grammar_gate.close()
        self.executor.close()
