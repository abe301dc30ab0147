"""The in-process engine: one scheduler, one executor, one iteration per ``step()``.

The engine is the thin shell around the pure scheduler core: it reads the clock, tokenizes,
runs the executor, moves swapped KV between device and host, detokenizes and applies stop
strings (which need text, so they cannot live in the token-level core)."""
from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from lenserve.engine.detokenizer import IncrementalDetokenizer
from lenserve.engine.profile import StepProfile
from lenserve_contract.outputs import CompletionOutput, RequestOutput
from lenserve_contract.sampling_params import InvalidRequestError, SamplingParams
from services.executor.interface import Executor
from services.executor.types import ExecutorOutput
from services.scheduler.config import SchedulerConfig
from services.scheduler.output import SchedulerOutput
from services.scheduler.request import FinishReason, Request
from services.scheduler.scheduler import Scheduler, SchedulerStats

logger = logging.getLogger(__name__)

FAKE_MODEL = "fake"   # deterministic model-free executor (see fake_executor.py)


@dataclass(frozen=True)
class EngineConfig:
    model: str
    policy: str = "vllm"
    block_size: int = 16
    num_gpu_blocks: int | None = None
    kv_cache_memory_bytes: int | None = None
    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 256
    enable_chunked_prefill: bool = True
    attention_backend: str = "auto"
    dtype: str = "float32"
    device: str = "cpu"
    max_model_len: int | None = None
    seed: int = 0
    check_integrity: bool = False    # assert block accounting after every step (tests)


def build_executor(config: EngineConfig) -> Executor:
    if config.model == FAKE_MODEL:
        from lenserve.engine.fake_executor import FakeExecutor
        return FakeExecutor(num_gpu_blocks=config.num_gpu_blocks or 1024,
                            block_size=config.block_size,
                            max_model_len=config.max_model_len or 2048)
    # Imported lazily: the model code pulls in transformers and the attention kernels.
    from services.executor.runner import InProcessExecutor
    return InProcessExecutor(
        config.model, block_size=config.block_size, num_gpu_blocks=config.num_gpu_blocks,
        kv_cache_memory_bytes=config.kv_cache_memory_bytes,
        attention_backend=config.attention_backend, dtype=config.dtype, device=config.device,
        max_model_len=config.max_model_len, seed=config.seed)


def scheduler_config(config: EngineConfig, executor: Executor) -> SchedulerConfig:
    info = executor.model_info()
    capacity = info.num_gpu_blocks * info.block_size
    # Unless asked otherwise, the context is what the model allows and the KV pool can hold.
    max_len = config.max_model_len or min(info.max_model_len, capacity)
    return SchedulerConfig(
        num_gpu_blocks=info.num_gpu_blocks, block_size=info.block_size, max_model_len=max_len,
        max_num_batched_tokens=config.max_num_batched_tokens, max_num_seqs=config.max_num_seqs,
        enable_chunked_prefill=config.enable_chunked_prefill, policy=config.policy)


class _Stream:
    """Engine-side state of one request: its text and what was already reported."""

    __slots__ = ("delta", "detok", "num_sent", "prompt", "request")

    def __init__(self, request: Request, prompt: str | None, detok: IncrementalDetokenizer,
                 delta: bool):
        self.request, self.prompt, self.detok, self.delta = request, prompt, detok, delta
        self.num_sent = 0


class LLMEngine:
    def __init__(self, config: EngineConfig, executor: Executor | None = None, tokenizer=None,
                 clock: Callable[[], float] = time.monotonic):
        self.config = config
        self.executor = executor if executor is not None else build_executor(config)
        self.tokenizer = tokenizer if tokenizer is not None else getattr(self.executor, "tokenizer", None)
        self.model_info = self.executor.model_info()
        self.scheduler = Scheduler(scheduler_config(config, self.executor))
        self.clock = clock
        self._streams: dict[str, _Stream] = {}
        self._host_kv: dict[str, object] = {}    # swapped-out KV, until a kvmanager owns it
        self.profile = StepProfile()

    # -- requests ---------------------------------------------------------------------------
    def add_request(self, request_id: str, prompt: str | None = None,
                    prompt_token_ids: list[int] | None = None,
                    sampling_params: SamplingParams | None = None,
                    arrival_time: float | None = None, *, delta: bool = False,
                    predicted_output_len: int | None = None, priority: int = 0,
                    slo_deadline_s: float | None = None) -> None:
        """Queue a request. Bad input raises InvalidRequestError and changes nothing.
        ``delta``: outputs carry only new tokens and text (streaming) instead of all so far."""
        if not isinstance(request_id, str) or not request_id:
            raise InvalidRequestError("request_id must be a non-empty string", field="request_id")
        params = sampling_params if sampling_params is not None else SamplingParams()
        if not isinstance(params, SamplingParams):
            raise InvalidRequestError(f"sampling_params must be SamplingParams, got "
                                      f"{type(params).__name__}", field="sampling_params")
        params.verify()
        token_ids = self._prompt_tokens(prompt, prompt_token_ids)
        arrival = self.clock() if arrival_time is None else arrival_time
        request = Request(request_id, token_ids, params, arrival,
                          eos_token_id=self.model_info.eos_token_id,
                          predicted_output_len=predicted_output_len, priority=priority,
                          slo_deadline_s=slo_deadline_s)
        self.scheduler.add_request(request)
        detok = IncrementalDetokenizer(self.tokenizer, token_ids, params.stop)
        self._streams[request_id] = _Stream(request, prompt, detok, delta)

    def _prompt_tokens(self, prompt: str | None, prompt_token_ids: list[int] | None) -> list[int]:
        if prompt_token_ids is None:
            if prompt is None:
                raise InvalidRequestError("either prompt or prompt_token_ids is required", field="prompt")
            if not isinstance(prompt, str):
                raise InvalidRequestError(f"prompt must be a string, got {type(prompt).__name__}",
                                          field="prompt")
            if not prompt:
                raise InvalidRequestError("prompt is empty", field="prompt")
            if self.tokenizer is None:
                raise InvalidRequestError("this engine has no tokenizer; pass prompt_token_ids",
                                          field="prompt")
            return self._encode(prompt)
        vocab = self.model_info.vocab_size
        bad = [t for t in prompt_token_ids if not isinstance(t, int) or not 0 <= t < vocab]
        if bad:
            raise InvalidRequestError(f"prompt_token_ids must be ints in [0, {vocab}); got {bad[0]!r}",
                                      field="prompt_token_ids")
        return list(prompt_token_ids)

    def _encode(self, prompt: str) -> list[int]:
        ids = list(self.tokenizer.encode(prompt))
        # WordPiece tokenizers close a text with [SEP], which is also such a model's EOS; a
        # prompt that already ends in EOS asks the model to continue past the end.
        if len(ids) > 1 and ids[-1] == self.model_info.eos_token_id:
            ids.pop()
        return ids

    def abort_request(self, request_id: str) -> RequestOutput | None:
        """Abort a request; returns its final output, or None if it is unknown or finished."""
        request = self.scheduler.abort_request(request_id)
        if request is None:
            return None
        return self._make_output(request)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    def get_num_unfinished_requests(self) -> int:
        return len(self.scheduler.state.requests)

    def stats(self) -> SchedulerStats:
        return self.scheduler.stats()

    # -- the loop ---------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Run one iteration. Returns outputs for requests that got tokens or finished."""
        scheduler = self.scheduler
        t0 = time.perf_counter()
        out = scheduler.schedule(self.clock())
        if out.is_empty:
            return []
        t1 = time.perf_counter()
        self._move_swapped_kv(out)
        try:
            result = (self.executor.execute(scheduler.make_executor_input(out)) if out.scheduled
                      else ExecutorOutput(out.iteration, {}))
        except Exception as exc:
            logger.exception("iteration %d failed", out.iteration)
            return self._fail_batch(out, exc)
        t2 = time.perf_counter()
        updated = scheduler.update_from_output(out, result, self.clock())
        outputs = [self._make_output(r) for r in updated]
        if self.config.check_integrity:
            scheduler.check_integrity()
        t3 = time.perf_counter()
        self.profile.add(t1 - t0, t2 - t1, result.timings, t3 - t2, t3 - t0)
        return outputs

    def _move_swapped_kv(self, out: SchedulerOutput) -> None:
        for rid, blocks in out.swapped_out:
            self._host_kv[rid] = self.executor.export_blocks(blocks)
        for rid, blocks in out.swapped_in:
            data = self._host_kv.pop(rid)
            self.executor.import_blocks(blocks, data[:, :, : len(blocks)])

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
        if new_tokens:
            stop = stream.detok.add_tokens(new_tokens)
            if stop is not None:
                self.scheduler.finish_request(request, FinishReason.STOP, stop)
        finished = request.is_finished
        start = stream.num_sent if stream.delta else 0
        stream.num_sent += len(new_tokens)
        text = (stream.detok.take_delta(finished) if stream.delta
                else stream.detok.visible_text(finished))
        completion = CompletionOutput(
            index=0, text=text, token_ids=request.output_token_ids[start:],
            finish_reason=request.finish_reason.value if finished else None,
            stop_reason=request.stop_reason)
        if finished:
            del self._streams[request.request_id]
            self._host_kv.pop(request.request_id, None)
        return RequestOutput(request.request_id, stream.prompt, request.prompt_token_ids,
                             [completion], finished, request.metrics, request.error)
