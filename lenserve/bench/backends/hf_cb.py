"""``hf-cb``: transformers' continuous batching (``ContinuousBatchingManager``).

Requests join the manager's background generation loop as they arrive; it schedules them
into a paged KV cache iteration by iteration. The manager stamps each generated token with
``time.perf_counter()``, which is mapped onto the runner's ``time.monotonic()`` clock.
EOS is disabled per request (``eos_token_id=-1``) so each stops exactly at its length.
"""
from __future__ import annotations

import importlib.util
import inspect
import math
import time

from lenserve.bench.backends.base import Backend, BackendOptions, failed_record
from lenserve.bench.metrics import RequestRecord
from lenserve.workloads.types import BenchRequest

PAGE_SIZE = 256
GPU_KV_TOKENS = 1 << 18


def page_size_arg(config_cls) -> str:
    """The name of the KV page size in ``ContinuousBatchingConfig``: ``block_size`` up to
    transformers 5.17, ``page_size`` from 5.18 (which still takes ``block_size``, deprecated)."""
    params = inspect.signature(config_cls).parameters
    return "page_size" if "page_size" in params else "block_size"


class HFContinuousBackend(Backend):
    def __init__(self, name: str, options: BackendOptions, model=None):
        super().__init__(name, options)
        self.model = model
        self.manager = None
        self._inflight: dict[str, tuple[BenchRequest, float]] = {}
        self._done: list[RequestRecord] = []
        self._perf_to_mono = time.monotonic() - time.perf_counter()

    def start(self) -> None:
        from transformers import ContinuousBatchingConfig, GenerationConfig
        if importlib.util.find_spec("psutil") is None:
            # On a CPU transformers sizes the paged cache from psutil's memory figures; without
            # it (up to 5.17) it sees 0 bytes free and the generation loop dies at once.
            raise RuntimeError("the hf-cb backend needs psutil: pip install psutil")
        if self.model is None:
            from services.executor.models.loader import build_hf_model
            self.model = build_hf_model(self.options.model, dtype=self.options.dtype,
                                        device=self.options.device)
        cb_config = ContinuousBatchingConfig(
            **{page_size_arg(ContinuousBatchingConfig): PAGE_SIZE},
            num_blocks=math.ceil(self._kv_tokens() / PAGE_SIZE),
            max_batch_tokens=self.options.hf_cb_max_batch_tokens,
            # Synthesised and dataset prompts share no prefixes worth caching; sharing would
            # only make the comparison depend on prompt content.
            allow_block_sharing=False)
        generation = GenerationConfig(do_sample=False, eos_token_id=-1, max_new_tokens=16)
        self.manager = self.model.eval().init_continuous_batching(
            generation_config=generation, continuous_batching_config=cb_config)
        self.manager.start()

    def _kv_tokens(self) -> int:
        # On a GPU the CPU-sized default would starve it: give it what lenserve gets.
        o = self.options
        if o.device.startswith("cuda") and o.hf_cb_kv_tokens == BackendOptions.hf_cb_kv_tokens:
            return GPU_KV_TOKENS
        return o.hf_cb_kv_tokens

    def submit(self, request: BenchRequest, arrival_time: float) -> None:
        key = self.unique_key(request)
        accepted = self.manager.add_request(list(request.prompt_token_ids), request_id=key,
                                            max_new_tokens=request.output_len,
                                            record_timestamps=True, eos_token_id=-1)
        if accepted is None:
            self._done.append(failed_record(request, arrival_time, "refused by the manager"))
            return
        self._inflight[key] = (request, arrival_time)

    def poll(self, timeout: float) -> list[RequestRecord]:
        result = self.manager.get_result(timeout=timeout) if self._inflight else None
        while result is not None:
            self._collect(result)
            result = self.manager.get_result(timeout=0)
        if self._inflight and not self.manager.is_running():
            self._fail_all("the continuous batching loop stopped")
        if not self._inflight and not self._done and timeout > 0:
            time.sleep(timeout)
        done, self._done = self._done, []
        return done

    def has_pending(self) -> bool:
        return bool(self._inflight or self._done)

    def close(self) -> None:
        if self.manager is not None:
            self.manager.stop(block=True, timeout=10)
            self.manager.destroy()
        self.manager = self.model = None

    def _collect(self, result) -> None:
        if not result.is_finished() or result.request_id not in self._inflight:
            return
        request, arrival = self._inflight.pop(result.request_id)
        stamps = [t + self._perf_to_mono for t in (result.timestamps or [])]
        finish = time.monotonic()
        if result.error is not None:
            self._done.append(failed_record(request, arrival, str(result.error)))
            return
        self._done.append(RequestRecord(request.request_id, request.prompt_len, request.output_len,
                                        arrival, stamps, finish,
                                        None if stamps else "no tokens returned"))

    def _fail_all(self, why: str) -> None:
        for request, arrival in self._inflight.values():
            self._done.append(failed_record(request, arrival, why))
        self._inflight.clear()
