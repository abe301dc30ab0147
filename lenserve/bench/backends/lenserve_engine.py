"""``lenserve:<policy>``: the in-process engine, stepped by the replay loop."""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field

from lenserve.bench.backends.base import Backend, BackendOptions, failed_record, trace_params
from lenserve.bench.defaults import MODEL_CONTEXT
from lenserve.bench.metrics import RequestRecord
from lenserve.workloads.types import BenchRequest
from lenserve_contract.outputs import RequestOutput


_COUNTERS = ("num_preemptions", "num_iterations", "num_upload_waits", "num_uploads_ahead",
             "prefix_cache_queries", "prefix_cache_hits",
             "prefix_cache_host_hits")


@dataclass
class _InFlight:
    request: BenchRequest
    arrival_time: float
    seen_times: list[float] = field(default_factory=list)  # when step() returned each token


class LenserveBackend(Backend):
    def __init__(self, name: str, policy: str, options: BackendOptions, engine=None):
        super().__init__(name, options)
        self.policy = policy
        self.engine = engine  # tests hand in a fake; start() builds the real one
        self._inflight: dict[str, _InFlight] = {}
        self._done: list[RequestRecord] = []
        self._prompt_text = None    # token ids -> text, for a length predictor that reads it

    def start(self) -> None:
        if self.engine is None:
            from lenserve.engine.llm_engine import EngineConfig, LLMEngine
            o = self.options
            predictor = self._predictor()
            self.engine = LLMEngine(EngineConfig(
                model=o.model, policy=self.policy, policy_config=o.policy_config,
                predictor=predictor, predictor_seed=o.predictor_seed,
                num_gpu_blocks=o.num_gpu_blocks, max_num_seqs=o.max_num_seqs,
                max_num_batched_tokens=o.max_num_batched_tokens, max_model_len=o.max_model_len,
                swap_space_gib=o.swap_space_gib, kv_int8=o.kv_int8, device=o.device,
                dtype=o.dtype, enforce_eager=o.enforce_eager,
                enable_prefix_caching=o.enable_prefix_caching,
                prefix_cache_host_blocks=o.prefix_cache_host_blocks),
                predictor_progress=_seed_progress)
            if self.learns_from_requests:
                # Requests go in as token ids (no detokenizing); the predictor reads text: the
                # decoded prompt, as the simulator hands it (``lenserve simulate``).
                from services.executor.factory import load_tokenizer
                tokenizer = load_tokenizer(o.model)
                self._prompt_text = lambda ids: tokenizer.decode(list(ids),
                                                                 skip_special_tokens=True)

    def _predictor(self) -> str:
        # The oracle policy is defined by the true lengths, whatever --predictor says.
        return "oracle" if self.policy == "oracle" else self.options.predictor

    @property
    def learns_from_requests(self) -> bool:
        # A real predictor (embedded, or a service) reads each prompt's text and observes
        # every finished request.
        from services.predictor.local import reads_prompts
        return reads_prompts(self._predictor())

    def submit(self, request: BenchRequest, arrival_time: float) -> None:
        key = self.unique_key(request)
        # Outputs end at the dataset's length, as the papers and vLLM's benchmark do, without
        # telling the policies (trace_params). Token ids only: the report counts tokens (hf-*
        # backends produce no text either).
        params = trace_params(self._context(), detokenize=False)
        try:
            text = self._prompt_text(request.prompt_token_ids) if self._prompt_text else None
            self.engine.add_request(key, prompt=text,
                                    prompt_token_ids=list(request.prompt_token_ids),
                                    sampling_params=params, arrival_time=arrival_time,
                                    true_output_len=request.output_len)
        except ValueError as exc:  # InvalidRequestError: refused, not crashed
            self._done.append(failed_record(request, arrival_time, str(exc)))
            return
        self._inflight[key] = _InFlight(request, arrival_time)

    def poll(self, timeout: float) -> list[RequestRecord]:
        if self.engine.has_unfinished_requests():
            outputs = self.engine.step()
            now = time.monotonic()
            for out in outputs:
                self._observe(out, now)
        elif self._inflight:
            # Nothing left in the engine yet no final output seen: fail them rather than wait forever.
            for key in list(self._inflight):
                flight = self._inflight.pop(key)
                self._done.append(failed_record(flight.request, flight.arrival_time,
                                                "the engine dropped the request"))
        elif timeout > 0:
            time.sleep(timeout)
        done, self._done = self._done, []
        return done

    def has_pending(self) -> bool:
        return bool(self._inflight or self._done)

    def close(self) -> None:
        if self.engine is not None and hasattr(self.engine, "close"):
            self.engine.close()
        self.engine = None

    def _context(self) -> int:
        scheduler = getattr(self.engine, "scheduler", None)
        if scheduler is not None:
            return scheduler.config.max_model_len
        return self.options.max_model_len or MODEL_CONTEXT

    def profile(self):
        return getattr(self.engine, "profile", None)

    def clear_cache(self) -> None:
        scheduler = getattr(self.engine, "scheduler", None)
        if scheduler is not None:
            scheduler.block_manager.reset_prefix_cache()
        if getattr(self.engine, "prefix_moves", None) is not None:
            self.engine.prefix_moves.clear()

    def counters(self) -> dict | None:
        stats = getattr(self.engine, "stats", None)
        if stats is None:
            return None
        s = stats()
        return {name: getattr(s, name) for name in _COUNTERS}

    def describe(self) -> dict:
        info = getattr(self.engine, "model_info", None)
        if info is None:
            return {}
        # The predictor too: bench chooses one per policy when --predictor is left out.
        return {"model": info.name, "dtype": info.dtype, "attention": info.attention_backend,
                "predictor": self._predictor()}

    def _observe(self, out: RequestOutput, now: float) -> None:
        flight = self._inflight.get(out.request_id)
        if flight is None:
            return
        new = len(out.outputs[0].token_ids) - len(flight.seen_times) if out.outputs else 0
        flight.seen_times.extend([now] * max(new, 0))
        if out.finished:
            del self._inflight[out.request_id]
            self._done.append(self._record(flight, out, now))

    @staticmethod
    def _record(flight: _InFlight, out: RequestOutput, now: float) -> RequestRecord:
        req, metrics = flight.request, out.metrics
        # The engine's own per-token times are exact; the step-return times are the fallback
        # when it does not fill them in.
        times = list(metrics.token_times) if metrics and metrics.token_times else flight.seen_times
        if len(times) != len(flight.seen_times):
            times = flight.seen_times
        reason = out.outputs[0].finish_reason if out.outputs else None
        error = out.error or (f"finished with {reason}" if reason in ("abort", "error") else None)
        error = error or (None if times else "no tokens returned")
        # The client holds the result when step() returns it: that, not the engine's internal
        # stamp, ends the JCT.
        return RequestRecord(req.request_id, req.prompt_len, req.output_len, flight.arrival_time,
                             times, now, error,
                             predicted_len=metrics.predicted_output_len if metrics else None,
                             prediction_source=metrics.prediction_source if metrics else None)


def _seed_progress(done: int, total: int) -> None:
    print(f"predictor: embedded {done}/{total} seed prompts", file=sys.stderr, flush=True)
