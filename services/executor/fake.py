"""A deterministic in-process Executor without a model, for tests and cost-model simulation.

Its "KV cache" stores token ids in the real block layout, and the next token is a hash of the
whole context *read back from the blocks*. A wrong block table, a lost swap or a bad
recompute therefore changes the output, which is what makes it a useful test double: the
same request must produce the same tokens whatever the policy, batch or preemptions.
"""
from __future__ import annotations

import random

import torch

from services.executor.block_tables import BlockTables
from services.executor.interface import Executor
from services.executor.types import ExecutorInput, ExecutorOutput, IterationTimings, ModelInfo

_FIRST_PRINTABLE, _NUM_PRINTABLE = 32, 95


class CharTokenizer:
    """Bytes as tokens (ids 0-255) plus EOS; enough for detokenization and stop strings."""

    def __init__(self):
        self.eos_token_id = 256
        self.vocab_size = 257

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str:
        data = bytes(t for t in token_ids if t < 256)
        return data.decode("utf-8", errors="replace")


class FakeExecutor(Executor):
    """``eos_period``: a context whose hash is divisible by it yields EOS (0 = never), so
    output lengths vary like a model's. ``cost_per_token_s`` / ``cost_per_iteration_s``
    fill ``timings`` with a linear cost model (nothing sleeps)."""

    def __init__(self, *, num_gpu_blocks: int = 64, block_size: int = 4,
                 max_model_len: int = 256, eos_period: int = 0,
                 cost_per_iteration_s: float = 0.0, cost_per_token_s: float = 0.0):
        self.tokenizer = CharTokenizer()
        self.block_size = block_size
        self.eos_period = eos_period
        self._costs = (cost_per_iteration_s, cost_per_token_s)
        self._kv = torch.full((num_gpu_blocks, block_size), -1, dtype=torch.int64)
        self._info = ModelInfo(
            name="fake", family="fake", vocab_size=self.tokenizer.vocab_size, num_layers=1,
            num_heads=1, num_kv_heads=1, head_dim=1, max_model_len=max_model_len,
            block_size=block_size, num_gpu_blocks=num_gpu_blocks, bytes_per_block=8 * block_size,
            eos_token_id=self.tokenizer.eos_token_id, dtype="int64", attention_backend="fake")
        self.num_calls = 0
        self.block_tables = BlockTables()

    def model_info(self) -> ModelInfo:
        return self._info

    def execute(self, batch: ExecutorInput) -> ExecutorOutput:
        self.num_calls += 1
        tables = self.block_tables.resolve(batch)
        self.block_tables.commit(batch, tables)
        for src, dst in batch.copy_blocks:
            self._kv[dst] = self._kv[src]
        sampled, top = {}, {}
        for seq, table in zip(batch.sequences, tables):
            self._write(table, seq.num_computed_tokens, seq.token_ids)
            if seq.sample:
                context = self._read(table, seq.context_len)
                token = sampled[seq.request_id] = self._next_token(context, seq)
                if seq.sampling_params.logprobs is not None:
                    top[seq.request_id] = _certain(token, seq.sampling_params.logprobs)
        iteration_s, token_s = self._costs
        num_tokens = sum(len(s.token_ids) for s in batch.sequences)
        cost = iteration_s + token_s * num_tokens
        return ExecutorOutput(batch.iteration, sampled, dict.fromkeys(sampled, 0.0),
                              IterationTimings(total_s=cost), top)

    def _write(self, table: list[int], start: int, tokens: list[int]) -> None:
        bs = self.block_size
        for pos, tok in enumerate(tokens, start):
            self._kv[table[pos // bs], pos % bs] = tok

    def _read(self, table: list[int], length: int) -> list[int]:
        rows = self._kv[table[: -(-length // self.block_size)]].reshape(-1)[:length]
        return rows.tolist()

    def _next_token(self, context: list[int], seq) -> int:
        if -1 in context:
            raise RuntimeError(f"{seq.request_id}: context reads unwritten KV slots")
        h = hash(tuple(context)) & 0x7FFFFFFF
        params = seq.sampling_params
        if not params.greedy:
            seed = params.seed if params.seed is not None else 0
            h = random.Random(h * 1_000_003 + seed).getrandbits(31)
        # Like a real sampler, EOS is masked until min_tokens outputs exist.
        if self.eos_period and h % self.eos_period == 0 and seq.num_output_tokens >= params.min_tokens:
            return self.tokenizer.eos_token_id
        return _FIRST_PRINTABLE + h % _NUM_PRINTABLE

    def export_blocks(self, block_ids: list[int], out: torch.Tensor | None = None) -> torch.Tensor:
        data = self._kv[block_ids].view(1, 1, len(block_ids), self.block_size, 1, 1)
        data = data.expand(1, 2, -1, -1, -1, -1)
        if out is None:
            return data.clone()
        out.copy_(data)
        return out

    def import_blocks(self, block_ids: list[int], data: torch.Tensor) -> None:
        self._kv[block_ids] = data[0, 0, :, :, 0, 0]


def _certain(token: int, k: int) -> list[tuple[int, float]]:
    """The fake model is certain of its token (log-probability 0); the alternatives it names
    are the next printable bytes, each at -100 (as good as impossible)."""
    others = [_FIRST_PRINTABLE + (token - _FIRST_PRINTABLE + i) % _NUM_PRINTABLE
              for i in range(1, k)]
    return [(token, 0.0)] + [(t, -100.0) for t in others][: max(0, k - 1)] if k else []
