"""Offline batch generation, shaped like vLLM's ``LLM``.

    llm = LLM(model="fake", num_gpu_blocks=256)
    outs = llm.generate(["Hello"], SamplingParams(max_tokens=16, temperature=0))
    outs[0].outputs[0].text
"""
from __future__ import annotations

import itertools
import weakref
from collections.abc import Sequence

from lenserve.engine.llm_engine import EngineConfig, LLMEngine
from lenserve_contract.outputs import RequestOutput
from lenserve_contract.sampling_params import InvalidRequestError, SamplingParams
from services.executor.interface import Executor


class LLM:
    def __init__(self, model: str, *, executor: Executor | None = None, tokenizer=None,
                 **engine_options):
        """``engine_options`` are EngineConfig fields: policy, block_size, num_gpu_blocks,
        max_num_batched_tokens, max_num_seqs, attention_backend, dtype, device, ..."""
        self.engine = LLMEngine(EngineConfig(model=model, **engine_options), executor, tokenizer)
        self._counter = itertools.count()
        # The engine's threads (the predictor's, the KV manager's) must stop before the
        # interpreter tears torch down under them, which aborts the process ("terminate called
        # without an active exception"): close when the LLM is collected or, at the latest,
        # at exit, even when the caller never calls close().
        self._closer = weakref.finalize(self, self.engine.close)

    def close(self) -> None:
        """Stop the engine's threads and free its KV; the LLM is unusable afterwards."""
        self._closer()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def get_tokenizer(self):
        return self.engine.tokenizer

    def generate(self, prompts: str | Sequence[str] | None = None,
                 sampling_params: SamplingParams | Sequence[SamplingParams] | None = None, *,
                 prompt_token_ids: Sequence[list[int]] | list[int] | None = None,
                 ) -> list[RequestOutput]:
        """Generate for every prompt; outputs come back in prompt order. A bad prompt or
        parameter raises InvalidRequestError naming its index, and nothing runs."""
        inputs = self._inputs(prompts, prompt_token_ids)
        params = self._params(sampling_params, len(inputs))
        ids = self._add_all(inputs, params)
        wanted = set(ids)
        finished: dict[str, RequestOutput] = {}
        while len(finished) < len(ids):
            outputs = self.engine.step()
            if not outputs:
                self._check_progress()
            for out in outputs:
                if out.finished and out.request_id in wanted:
                    finished[out.request_id] = out
        return [finished[rid] for rid in ids]

    def _check_progress(self) -> None:
        # Nothing on the device and nothing produced: a policy that admits nothing from an
        # empty pool would otherwise spin here forever.
        stats = self.engine.stats()
        if stats.num_running == 0 and stats.num_free_blocks == stats.num_total_blocks:
            raise RuntimeError(f"policy {stats.policy!r} admitted no waiting request into an "
                               f"empty KV pool: {stats}")

    def _add_all(self, inputs: list[tuple[str | None, list[int] | None]],
                 params: list[SamplingParams]) -> list[str]:
        ids: list[str] = []
        for i, ((text, tokens), sp) in enumerate(zip(inputs, params)):
            rid = str(next(self._counter))
            try:
                self.engine.add_request(rid, prompt=text, prompt_token_ids=tokens, sampling_params=sp)
            except InvalidRequestError as exc:
                for added in ids:
                    self.engine.abort_request(added)
                raise InvalidRequestError(f"prompt {i}: {exc}", exc.field, exc.code) from exc
            ids.append(rid)
        return ids

    @staticmethod
    def _inputs(prompts, prompt_token_ids) -> list[tuple[str | None, list[int] | None]]:
        if (prompts is None) == (prompt_token_ids is None):
            raise InvalidRequestError("pass exactly one of prompts or prompt_token_ids", field="prompt")
        if prompts is not None:
            return [(p, None) for p in ([prompts] if isinstance(prompts, str) else prompts)]
        single = len(prompt_token_ids) > 0 and isinstance(prompt_token_ids[0], int)
        token_lists = [prompt_token_ids] if single else prompt_token_ids
        return [(None, list(t)) for t in token_lists]

    @staticmethod
    def _params(sampling_params, n: int) -> list[SamplingParams]:
        if sampling_params is None or isinstance(sampling_params, SamplingParams):
            return [sampling_params or SamplingParams()] * n
        if len(sampling_params) != n:
            raise InvalidRequestError(
                f"got {len(sampling_params)} sampling_params for {n} prompts", field="sampling_params")
        return list(sampling_params)
