"""``hf-static``: Hugging Face ``generate`` with request-level batching.

Up to ``hf_batch_size`` arrived requests are padded on the left and decoded together until the
longest one is done; nothing joins a running batch, and its results return together at the
end. Every token is timed when its decoding step finishes (the step clock below), so TTFT,
ITL and E2EL are those of a streaming client; JCT ends at the batch's end.
"""
from __future__ import annotations

import time

import torch
from transformers import StoppingCriteria, StoppingCriteriaList

from lenserve.bench.backends.base import Backend, BackendOptions, failed_record
from lenserve.bench.metrics import RequestRecord
from lenserve.workloads.types import BenchRequest


class _StepClock(StoppingCriteria):
    """Never stops generation; notes when each decoding step produced its token."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs) -> torch.BoolTensor:
        self.times.append(time.monotonic())
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)


def pad_left(prompts: list[tuple[int, ...]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded ids and attention mask, so every prompt ends where decoding begins."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt):] = torch.tensor(prompt, dtype=torch.long)
        mask[row, width - len(prompt):] = 1
    return ids, mask


class HFStaticBackend(Backend):
    def __init__(self, name: str, options: BackendOptions, model=None):
        super().__init__(name, options)
        self.model = model
        self._queue: list[tuple[BenchRequest, float]] = []

    def start(self) -> None:
        if self.model is None:
            from services.executor.models.loader import build_hf_model
            self.model = build_hf_model(self.options.model, dtype=self.options.dtype,
                                        device=self.options.device)
        self.model.eval()

    def submit(self, request: BenchRequest, arrival_time: float) -> None:
        self._queue.append((request, arrival_time))

    def poll(self, timeout: float) -> list[RequestRecord]:
        if not self._queue:
            if timeout > 0:
                time.sleep(timeout)
            return []
        batch = self._queue[:self.options.hf_batch_size]
        del self._queue[:len(batch)]
        try:
            return self._run(batch)
        except (RuntimeError, ValueError) as exc:
            return [failed_record(r, t, f"generate failed: {exc}") for r, t in batch]

    def has_pending(self) -> bool:
        return bool(self._queue)

    def close(self) -> None:
        self.model = None

    def _pad_id(self) -> int:
        config = self.model.config
        for value in (config.pad_token_id, config.eos_token_id, 0):
            if isinstance(value, list):
                value = value[0] if value else None
            if value is not None:
                return int(value)
        return 0

    @torch.inference_mode()
    def _run(self, batch: list[tuple[BenchRequest, float]]) -> list[RequestRecord]:
        ids, mask = pad_left([r.prompt_token_ids for r, _ in batch], self._pad_id())
        longest = max(r.output_len for r, _ in batch)
        clock = _StepClock()
        # min_new_tokens = max_new_tokens suppresses EOS: every request gets the whole run, and
        # shorter ones keep only their own length (the waste request-level batching pays).
        self.model.generate(input_ids=ids.to(self.model.device), attention_mask=mask.to(self.model.device),
                            max_new_tokens=longest, min_new_tokens=longest, do_sample=False,
                            pad_token_id=self._pad_id(), stopping_criteria=StoppingCriteriaList([clock]))
        end = time.monotonic()
        return [RequestRecord(r.request_id, r.prompt_len, r.output_len, t,
                              clock.times[:r.output_len], end) for r, t in batch]
