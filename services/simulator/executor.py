"""The cost-model executor: an ``Executor`` that runs no model. Each iteration advances the
virtual clock by the cost model's time for its batch and samples a fixed ordinary token, so
the serving core, the policy and the block accounting run exactly as they do on a device."""
from __future__ import annotations

from typing import TYPE_CHECKING

from services.executor.interface import Executor
from services.executor.types import ExecutorInput, ExecutorOutput, IterationTimings, ModelInfo
from services.simulator.cost_model import CostModel
from services.simulator.features import IterationFeatures, from_input, from_scheduled
from services.simulator.shapes import ModelShape

if TYPE_CHECKING:
    import torch


STREAM_MODES = ("link", "cpu", "free")


def _streamed(scheduled):
    return [(r, q) for r, q in scheduled if r.status.value == "swapped"]


class VirtualClock:
    """Seconds of simulated time; the engine reads it, the executor and the replay move it."""

    def __init__(self, start: float = 0.0):
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds

    def advance_to(self, t: float) -> None:
        self.now = max(self.now, t)


class SimExecutor(Executor):
    def __init__(self, shape: ModelShape, cost: CostModel, clock: VirtualClock, *,
                 num_gpu_blocks: int, block_size: int = 16, scheduler=None):
        """``scheduler``: the policy's measured CPU time per iteration
        (``overheads.SchedulerOverhead``), added to the device's; None: free."""
        self.shape, self.cost, self.clock = shape, cost, clock
        self.scheduler = scheduler
        self.scheduler_s = 0.0
        self.block_size, self.num_gpu_blocks = block_size, num_gpu_blocks
        # Outputs are forced to a length (ignore_eos), so any ordinary token will do.
        self.token = 1000 if shape.eos_token_id != 1000 else 1001
        self.busy_s = 0.0
        self.num_calls = 0
        # Streamed waves (FluidInfer): the host link their per-layer uploads cross, set when
        # the engine connects a simulated host tier (``attach_stream_source``); the copy
        # seconds charged, the part hidden behind compute and the stalls.
        self.stream_link = None
        self.stream_mode = "link"
        self.stream_copy_s = self.stream_hidden_s = self.stream_stall_s = 0.0

    def attach_stream_source(self, source) -> None:
        """Streamed requests (status SWAPPED in a batch) are charged their per-layer upload
        over ``self.stream_link`` (see ``stream_s``)."""

    def set_stream_mode(self, mode: str) -> None:
        """Where streamed waves' attention runs: ``link`` (uploaded over the host link into the
        device's staging, the report's Fig. 8), ``cpu`` (on the host's cores where the KV
        lives, NEO's way: no KV crosses the link) or ``free`` (an infinitely fast link: what
        the mechanism gives with copies that cost nothing)."""
        if mode not in STREAM_MODES:
            raise ValueError(f"stream_mode must be one of {', '.join(STREAM_MODES)}, got {mode!r}")
        if mode == "cpu" and not (self.stream_link and self.stream_link.host_attention_bytes_per_s):
            raise ValueError("stream_mode=cpu needs the host CPU's attention throughput, which "
                             "this target does not model (use --hardware)")
        self.stream_mode = mode

    def stream_bytes_per_s(self) -> float:
        """KV bytes per second the streamed waves are fed at (0: no bound)."""
        link = self.stream_link
        if link is None or self.stream_mode == "free":
            return 0.0
        return link.host_attention_bytes_per_s if self.stream_mode == "cpu" else link.in_bytes_per_s

    def stream_s(self, scheduled, compute_s: float) -> float:
        """Stall seconds of the batch's streamed waves. Per layer, the streamed waves' work off
        the device runs while that layer computes; where it outlasts the layer's share of the
        iteration, the layer waits for it. ``link``: the streamed requests' KV of the layer
        crosses the host link (one copy per request) and the new K/V goes back. ``cpu``: the
        host's cores attend over that KV in place, and only the queries, the new K/V and the
        attention output cross the link. A link that does not overlap compute (a CPU executor)
        copies nothing: attention reads the host tier in place, and its reads are already in
        the cost model's context term."""
        link = self.stream_link
        if link is None or not link.overlaps_compute or self.stream_mode == "free":
            return 0.0
        streamed = _streamed(scheduled)
        if not streamed:
            return 0.0
        s = self.shape
        layers = s.num_layers
        per_token = s.kv_bytes_per_token() / layers
        written = sum(q for _, q in streamed) * per_token
        if self.stream_mode == "cpu":
            context = sum(r.num_computed_tokens + q for r, q in streamed)
            act = sum(q for _, q in streamed) * s.hidden_size * s.dtype_bytes    # q, output
            copy = (context * per_token / link.host_attention_bytes_per_s
                    + max(link.seconds(int(act + written), out=True),
                          link.seconds(int(act), out=False)))
        else:
            upload = sum(link.seconds(int(r.num_computed_tokens * per_token), out=False)
                         for r, _ in streamed)
            copy = max(upload, link.seconds(int(written), out=True))
        layer = compute_s / layers
        self.stream_copy_s += copy * layers
        self.stream_hidden_s += min(copy, layer) * layers
        stall = max(0.0, copy - layer) * layers
        self.stream_stall_s += stall
        return stall

    def token_seconds(self, n: int) -> float:
        """Seconds of the token-wise layers (and the fixed per-iteration cost) for ``n`` decode
        tokens, no attention: the curve a policy sizes its token budget by."""
        return self.cost.iteration_s(IterationFeatures(n, n, 0.0, n, 0))

    def model_info(self) -> ModelInfo:
        s = self.shape
        return ModelInfo(
            name=s.name, family=s.family, vocab_size=s.vocab_size, num_layers=s.num_layers,
            num_heads=s.num_heads, num_kv_heads=s.num_kv_heads, head_dim=s.head_dim,
            max_model_len=s.max_model_len, block_size=self.block_size,
            num_gpu_blocks=self.num_gpu_blocks,
            bytes_per_block=s.kv_bytes_per_token() * self.block_size,
            eos_token_id=s.eos_token_id, dtype=s.dtype, attention_backend="cost-model")

    def execute(self, batch: ExecutorInput) -> ExecutorOutput:
        features = from_input(batch) if batch.sequences else None
        return self._run(batch.iteration, features,
                         [s.request_id for s in batch.sequences if s.sample],
                         len(batch.sequences))

    def execute_scheduled(self, iteration: int, scheduled) -> ExecutorOutput:
        """``execute`` on the scheduler's plan itself, ``(request, tokens fed)`` pairs, which
        the engine hands an executor that has this method: the same result without an
        ``ExecutorInput`` (token ids and block tables a cost model never reads). Reads the
        requests, never changes them."""
        features, sampled_ids = from_scheduled(scheduled) if scheduled else (None, [])
        if self.stream_mode == "cpu" and features is not None and (streamed := _streamed(scheduled)):
            # The device attends only over the residents: the streamed waves' attention is the
            # host's (``stream_s``).
            off, _ = from_scheduled(streamed)
            features = features._replace(attended=features.attended - off.attended,
                                         context=features.context - off.context)
        return self._run(iteration, features, sampled_ids, len(scheduled), scheduled)

    def _run(self, iteration: int, features: IterationFeatures | None,
             sampled_ids: list[str], num_seqs: int = 0, scheduled=()) -> ExecutorOutput:
        seconds = self.cost.iteration_s(features) if features is not None else 0.0
        stall = self.stream_s(scheduled, seconds) if self.stream_link and scheduled else 0.0
        seconds += stall
        if self.scheduler is not None and num_seqs:
            cpu = self.scheduler.seconds(num_seqs)
            self.scheduler_s += cpu
            self.clock.advance(cpu)
        self.clock.advance(seconds)
        self.busy_s += seconds
        self.num_calls += 1
        return ExecutorOutput(iteration, dict.fromkeys(sampled_ids, self.token),
                              timings=IterationTimings(forward_s=seconds, total_s=seconds,
                                                        swap_s=stall))

    def export_blocks(self, block_ids: list[int]) -> torch.Tensor:
        raise NotImplementedError("the simulator models no host KV tier (use --swap-space 0)")

    def import_blocks(self, block_ids: list[int], data: torch.Tensor) -> None:
        raise NotImplementedError("the simulator models no host KV tier (use --swap-space 0)")
