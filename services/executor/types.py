"""Plain data exchanged between the scheduler and the executor (one iteration each way).

The executor never mutates scheduler state: it receives an ``ExecutorInput`` and returns an
``ExecutorOutput``. The gRPC transport maps these 1:1 onto ``executor.proto``
(``services/executor/convert.py``).

Block tables travel as changes: the executor keeps each running request's table, the
scheduler sends a whole table once (``block_table_is_delta=False``: first schedule, or after
the table was rewritten by a loan) and afterwards only the blocks appended since, and names
the requests whose tables the executor may forget (``finished_request_ids``).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from lenserve_contract.sampling_params import SamplingParams


@dataclass
class ScheduledSequence:
    """One request's slice of an iteration: a prompt chunk or a single decode token."""

    request_id: str
    token_ids: list[int]            # tokens fed this iteration
    num_computed_tokens: int        # tokens already in KV = position of token_ids[0]
    block_table: list[int]          # whole table, or the blocks appended since last sent
    sample: bool                    # sample after the last fed token (last prompt chunk / decode)
    sampling_params: SamplingParams
    num_output_tokens: int = 0      # advances the per-request seeded RNG deterministically
    block_table_is_delta: bool = False
    # With a whole table (not a delta), for a request whose sampling reads its earlier tokens
    # (penalties, a grammar): the tokens already in the KV cache, before ``token_ids``.
    context_token_ids: list[int] = field(default_factory=list)
    # A streamed request (FluidInfer): its KV lives in the host tier, in these host blocks
    # (the whole table, every iteration); ``block_table`` is then empty. Its attention reads
    # the host blocks layer by layer and only its new K/V is written back.
    host_block_table: list[int] | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def context_len(self) -> int:
        """Tokens this request has in KV once this iteration has run."""
        return self.num_computed_tokens + len(self.token_ids)


@dataclass
class ExecutorInput:
    iteration: int
    sequences: list[ScheduledSequence]
    copy_blocks: list[tuple[int, int]] = field(default_factory=list)   # (src, dst) device blocks
    # Requests whose block tables the executor forgets before this iteration (finished,
    # preempted or swapped out since the last call).
    finished_request_ids: list[str] = field(default_factory=list)
    # Attention wave by wave (FluidInfer): each wave lists indices into ``sequences``; None
    # runs every sequence's attention at once.
    waves: list[list[int]] | None = None
    # Block moves with a host buffer the KV manager shares with the executor (the gRPC
    # transport; in one process the KV manager copies through ``export_blocks`` itself):
    # (device block, host slot) before the forward pass, then (host slot, device block).
    swap_out: list[tuple[int, int]] = field(default_factory=list)
    swap_in: list[tuple[int, int]] = field(default_factory=list)
    swap_buffer: str = ""


@dataclass
class IterationTimings:
    forward_s: float = 0.0
    attention_s: float = 0.0
    sample_s: float = 0.0
    total_s: float = 0.0
    swap_s: float = 0.0                     # block moves of swap_out / swap_in
    wave_attention_s: list[float] = field(default_factory=list)   # attention per wave


@dataclass
class ExecutorOutput:
    iteration: int
    sampled: dict[str, int]                     # request_id -> token, for sequences with sample=True
    logprobs: dict[str, float] = field(default_factory=dict)
    timings: IterationTimings = field(default_factory=IterationTimings)
    # Requests that asked for logprobs: the most likely (token, logprob) pairs at the step.
    top_logprobs: dict[str, list[tuple[int, float]]] = field(default_factory=dict)


@dataclass(frozen=True)
class ModelInfo:
    name: str
    family: str
    vocab_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_model_len: int
    block_size: int
    num_gpu_blocks: int
    bytes_per_block: int
    eos_token_id: int | None
    dtype: str
    attention_backend: str
    # Every token that ends a text (generation_config.json may list several, e.g. Llama 3's
    # <|end_of_text|>, <|eom_id|>, <|eot_id|>); () means just eos_token_id.
    eos_token_ids: tuple[int, ...] = ()
