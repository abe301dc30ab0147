"""Virtual-time replay: the workload against the real ``EngineCore`` and policy with the
cost-model executor. Nothing sleeps: the engine's clock is the simulator's clock, moved by
each iteration's modelled time and, when the engine is idle, to the next arrival.

Records, summaries and reports are ``lenserve bench``'s own (``BackendRun``)."""
from __future__ import annotations

import gc
import time
from contextlib import contextmanager
from dataclasses import dataclass

from tqdm import tqdm

from lenserve.bench.backends.base import BackendOptions, failed_record, trace_params
from lenserve.bench.metrics import RequestRecord
from lenserve.bench.runner import BackendRun, counter_deltas
from lenserve.workloads.followups import Arrivals
from lenserve.workloads.types import BenchRequest, Workload
from lenserve_contract.outputs import RequestOutput
from services.scheduler.engine_core import EngineCore
from services.scheduler.wiring import EngineConfig, engine_parts
from services.kvmanager.config import KVManagerConfig
from services.simulator.executor import SimExecutor, VirtualClock
from services.simulator.host_tier import SimKVManager
from services.simulator.target import SimTarget


@dataclass(frozen=True)
class SimSpec:
    name: str                  # sim:<policy>
    policy: str
    target: SimTarget
    options: BackendOptions
    prompt_text: object = None     # token ids -> text for the predictor (None: no text)


def build_engine(spec: SimSpec, clock: VirtualClock, time_model=None) -> EngineCore:
    t, o = spec.target, spec.options
    blocks = num_gpu_blocks(spec)
    charged = t.overheads
    executor = SimExecutor(t.shape, t.cost, clock, num_gpu_blocks=blocks,
                           block_size=t.block_size,
                           scheduler=charged.scheduler_for(spec.policy) if charged else None)
    # The oracle policy is defined by the true lengths, whatever --predictor says.
    predictor = "oracle" if spec.policy == "oracle" else o.predictor
    config = EngineConfig(
        model=t.shape.name, policy=spec.policy, policy_config=o.policy_config,
        block_size=t.block_size, num_gpu_blocks=blocks,
        max_num_batched_tokens=o.max_num_batched_tokens, max_num_seqs=o.max_num_seqs,
        max_model_len=max_model_len(spec), predictor=predictor,
        predictor_seed=o.predictor_seed, swap_space_gib=o.swap_space_gib, kv_int8=o.kv_int8,
        enable_prefix_caching=o.enable_prefix_caching,
        prefix_cache_host_blocks=o.prefix_cache_host_blocks)
    engine = EngineCore(**engine_parts(config, executor,
                                       kv_manager=host_tier(spec, executor, clock)),
                        tokenizer=None, clock=clock, finished_outputs_only=True,
                        time_model=time_model)
    latency = charged.predictor_for(predictor) if charged else 0.0
    if engine.predictions is not None and latency > 0:
        from services.simulator.overheads import DelayedPredictions
        engine.predictions = DelayedPredictions(engine.predictions, clock, latency)
    return engine


def host_tier(spec: SimSpec, executor: SimExecutor, clock: VirtualClock) -> SimKVManager | None:
    """The simulated host KV tier of ``--swap-space`` GiB (None without one)."""
    o, link = spec.options, spec.target.link
    if o.swap_space_gib <= 0:
        return None
    if link is None:
        raise ValueError("this profile has no swap measurements, so the host KV tier cannot be "
                         "simulated: re-run `lenserve profile` (it measures swaps now) or use "
                         "--swap-space 0")
    from services.scheduler.policies import wants_kv_int8
    int8 = wants_kv_int8(spec.policy, list(o.policy_config), o.kv_int8)
    executor.stream_link = link     # streamed waves (fluidinfer) cross the same link
    return SimKVManager(KVManagerConfig(o.swap_space_gib, int8=int8),
                        executor.model_info(), link, clock)


def num_gpu_blocks(spec: SimSpec) -> int:
    """``--num-gpu-blocks`` sizes the simulated pool against the workload, else the target's
    memory does."""
    return spec.options.num_gpu_blocks or spec.target.num_gpu_blocks


def max_model_len(spec: SimSpec) -> int:
    """The context limit asked for, within the model and the simulated KV pool."""
    t = spec.target
    limits = [t.shape.max_model_len, num_gpu_blocks(spec) * t.block_size]
    return min(limits + ([spec.options.max_model_len] if spec.options.max_model_len else []))


class _Replay:
    def __init__(self, spec: SimSpec, workload: Workload):
        self.spec, self.clock = spec, VirtualClock()
        self.engine = build_engine(spec, self.clock)
        self.limit = max_model_len(spec)
        self.pending = Arrivals(workload.requests)
        self.inflight: dict[str, tuple[BenchRequest, float]] = {}
        self.done: list[RequestRecord] = []
        # Time-weighted KV occupancy: blocks allocated, and tokens actually stored in them.
        self.kv_weight_s = self.kv_allocated_s = self.kv_used_s = self.kv_lent_s = 0.0

    def submit_due(self) -> None:
        for request, due in self.pending.pop_due(self.clock.now):
            self.submit(request, due)

    def _finish(self, record: RequestRecord) -> None:
        self.done.append(record)
        self.pending.finished(record.request_id, self.clock.now)

    def submit(self, request: BenchRequest, arrival: float) -> None:
        if request.prompt_len + request.output_len > self.limit:
            self._finish(failed_record(request, arrival, (
                f"needs {request.prompt_len + request.output_len} tokens of context; the "
                f"simulated engine holds {self.limit} (model limit or KV pool)")))
            return
        params = trace_params(self.engine.scheduler.config.max_model_len)
        text = self.spec.prompt_text
        try:
            self.engine.add_request(
                request.request_id, prompt=text(request.prompt_token_ids) if text else None,
                prompt_token_ids=list(request.prompt_token_ids), sampling_params=params,
                arrival_time=arrival, delta=True, true_output_len=request.output_len)
        except ValueError as exc:    # refused by the real validation, as the engine would
            self._finish(failed_record(request, arrival, str(exc)))
            return
        self.inflight[request.request_id] = (request, arrival)

    def run(self, bar: tqdm) -> None:
        engine, clock = self.engine, self.clock
        while self.pending or engine.has_unfinished_requests():
            if not engine.has_unfinished_requests():
                clock.advance_to(self.pending.next_time())
            self.submit_due()
            before, finished = clock.now, len(self.done)
            self._step()
            bar.update(len(self.done) - finished)
            # An iteration that only started uploads takes no virtual time (they land in the
            # background): that is progress, one that ran and moved nothing is not.
            if (clock.now == before and len(self.done) == finished
                    and engine.last_step_empty):
                self._stalled()

    def _step(self) -> None:
        self._settle_predictor()
        before = self.clock.now
        for out in self.engine.step():
            if out.finished:
                self._finish(self._record(out))
        self._sample_kv(self.clock.now - before)

    def _sample_kv(self, seconds: float) -> None:
        if seconds <= 0.0:
            return
        state = self.engine.scheduler.state
        bm = state.block_manager
        capacity = bm.num_blocks * bm.block_size
        used = sum(r.num_computed_tokens for r in state.running.values())
        self.kv_weight_s += seconds
        self.kv_allocated_s += seconds * (bm.num_blocks - bm.num_free_blocks) / bm.num_blocks
        self.kv_used_s += seconds * min(used / capacity, 1.0)
        # KV pipelining: blocks on loan from a host's allocation (reported if any was)
        self.kv_lent_s += seconds * bm.num_lent_blocks / bm.num_blocks

    def stats(self) -> dict:
        """Engine counters over the run: preemptions, iterations, KV utilisation (allocated
        and used, time-weighted over busy time), and the scheduler's wall time per iteration
        on this CPU with its share of a request's time were it serial with the modelled
        iterations (the paper's scheduling time over JCT)."""
        stats, profile = self.engine.stats(), self.engine.profile
        busy = self.engine.executor.busy_s
        steps = max(profile.steps, 1)
        weight = max(self.kv_weight_s, 1e-12)
        counters = counter_deltas({}, {"num_preemptions": stats.num_preemptions,
                                       "num_iterations": stats.num_iterations,
                                       "prefix_cache_queries": stats.prefix_cache_queries,
                                       "prefix_cache_hits": stats.prefix_cache_hits,
                                       "prefix_cache_host_hits": stats.prefix_cache_host_hits,
                                       "num_upload_waits": stats.num_upload_waits,
                                       "num_uploads_ahead": stats.num_uploads_ahead})
        return {**counters,
                "kv_allocated_util": self.kv_allocated_s / weight,
                "kv_used_util": self.kv_used_s / weight,
                **({"kv_lent_util": self.kv_lent_s / weight} if self.kv_lent_s else {}),
                **self.engine.scheduler.policy.counters(),
                "schedule_ms_per_iteration": profile.schedule_s / steps * 1e3,
                "schedule_share": profile.schedule_s / max(profile.schedule_s + busy, 1e-12),
                **self.stream_stats()}

    def stream_stats(self) -> dict:
        """Streamed waves (fluidinfer): host-link seconds charged, hidden behind compute,
        and stalled (none without streaming)."""
        ex = self.engine.executor
        if not ex.stream_copy_s:
            return {}
        return {"stream_copy_s": ex.stream_copy_s, "stream_hidden_s": ex.stream_hidden_s,
                "stream_stall_s": ex.stream_stall_s}

    def _stalled(self) -> None:
        """The engine ran nothing: wait for the next arrival, or, with none left, fail what
        it holds rather than spin (a policy that can never admit them)."""
        if self.pending.next_time() is not None:
            self.clock.advance_to(self.pending.next_time())
            return
        for rid in list(self.inflight):
            out = self.engine.abort_request(rid)
            request, arrival = self.inflight.pop(rid)
            why = "the simulated engine made no progress (the request can never be scheduled)"
            self._finish(failed_record(request, arrival, why if out is None else
                                       out.error or why))

    def _settle_predictor(self) -> None:
        # Predictions land before the next iteration, so a run does not depend on the
        # predictor thread's timing (same seed, same summary). Predictor latency is not
        # modelled: a real engine may schedule some requests before their prediction lands.
        pump = self.engine.predictions
        while pump is not None and not pump.idle():
            time.sleep(0.0005)

    def _record(self, out: RequestOutput) -> RequestRecord:
        request, arrival = self.inflight.pop(out.request_id)
        m = out.metrics
        reason = out.outputs[0].finish_reason if out.outputs else None
        error = out.error or (f"finished with {reason}" if reason in ("abort", "error") else None)
        # A finished request's token times never change again: the record takes the list.
        return RequestRecord(request.request_id, request.prompt_len, request.output_len,
                             arrival, m.token_times, self.clock.now, error,
                             predicted_len=m.predicted_output_len,
                             prediction_source=m.prediction_source)


@contextmanager
def _no_cycle_collection():
    """The replay keeps every request it has seen (token lists, records) and allocates
    steadily: the cycle collector's full passes over that growing heap took 3.9 s of an 80 s
    replay of 100,000 requests. What the replay drops is freed by reference counting."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def simulate(spec: SimSpec, workload: Workload, request_rate: float,
             show_progress: bool = True) -> BackendRun:
    """One run of ``workload``; records in workload order, times in virtual seconds."""
    replay = _Replay(spec, workload)
    label = f"{spec.name} @ {request_rate:g} req/s"
    try:
        with tqdm(total=len(workload.requests), desc=label, unit="req",
                  disable=not show_progress) as bar, _no_cycle_collection():
            replay.run(bar)
        stats = replay.stats()
    finally:
        replay.engine.close()
    order = {r.request_id: i for i, r in enumerate(workload.requests)}
    records = sorted(replay.done, key=lambda r: order[r.request_id])
    # The engine's StepProfile would time the simulator, not the simulated device: left out.
    return BackendRun(spec.name, request_rate, replay.clock.now, records, None, stats)
