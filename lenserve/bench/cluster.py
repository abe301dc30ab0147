"""Cluster mode of the virtual-time replay (``lenserve simulate --replicas N --router P``):
the real router core places each request on one of N simulated replicas, each the real
``EngineCore`` and policy on the cost-model executor with its own virtual clock.

Events run in time order: the next arrival, or the next iteration of the busy replica whose
clock is furthest behind. The router predicts each request once (the replicas run without a
predictor and take its length with the request, as the live router sends it) and sees each
replica's ``ReplicaLoad`` as a live one does: a report every ``load_interval_s`` of virtual
time, plus what it placed since."""
from __future__ import annotations

import dataclasses
import math

from tqdm import tqdm

from lenserve.bench.backends.base import failed_record, trace_params
from lenserve.bench.metrics import RequestRecord
from lenserve.bench.runner import BackendRun
from lenserve.bench.simulation import SimSpec, _no_cycle_collection, build_engine, max_model_len
from lenserve.workloads.followups import Arrivals
from lenserve.workloads.types import BenchRequest, Workload
from services.predictor.interface import PredictQuery
from services.router.core import Placement, RouterCore
from services.scheduler.load import DEFAULT_OUTPUT_LEN, replica_load
from services.scheduler.policies.time_model import ExecutionTimeModel
from services.simulator.executor import VirtualClock

LOAD_INTERVAL_S = 0.1       # the live StreamLoad default


@dataclasses.dataclass(frozen=True)
class ClusterSpec:
    replicas: int
    router: str
    load_interval_s: float = LOAD_INTERVAL_S


class _Replica:
    def __init__(self, name: str, spec: SimSpec):
        self.name, self.clock = name, VirtualClock()
        self.engine = build_engine(spec, self.clock, time_model=ExecutionTimeModel())
        self.reported_at = -math.inf


class _ClusterReplay:
    def __init__(self, spec: SimSpec, cluster: ClusterSpec, workload: Workload):
        self.spec, self.cluster = spec, cluster
        replica_spec = dataclasses.replace(
            spec, options=dataclasses.replace(spec.options, predictor="none"))
        self.replicas = [_Replica(f"replica-{i}", replica_spec) for i in range(cluster.replicas)]
        self.core = RouterCore(cluster.router)
        for r in self.replicas:
            self.core.add_replica(r.name)
        self.by_name = {r.name: r for r in self.replicas}
        self.predictor = _router_predictor(spec)
        self.limit = max_model_len(spec)
        self.pending = Arrivals(workload.requests)
        self.inflight: dict[str, tuple[BenchRequest, float, tuple | None]] = {}
        self.done: list[RequestRecord] = []
        # At each arrival, the spread of the replicas' unfinished requests (max - min) and
        # their coefficient of variation: how evenly the router keeps them busy.
        self.spread_sum = self.cv_sum = 0.0
        self.num_arrivals = 0

    @property
    def now(self) -> float:
        return max(r.clock.now for r in self.replicas)

    def run(self, bar: tqdm) -> None:
        while True:
            busy = [r for r in self.replicas if r.engine.has_unfinished_requests()]
            due = self.pending.next_time()
            arrival = math.inf if due is None else due
            if not busy and not self.pending:
                return
            nxt = min(busy, key=lambda r: r.clock.now) if busy else None
            if nxt is None or arrival <= nxt.clock.now:
                for request, at in self.pending.pop_due(arrival):
                    self._arrive(request, at)
                continue
            finished = len(self.done)
            before = nxt.clock.now
            for out in nxt.engine.step():
                if out.finished:
                    self._finish(self._record(out, nxt.clock.now))
            bar.update(len(self.done) - finished)
            if (nxt.clock.now == before and len(self.done) == finished
                    and nxt.engine.last_step_empty):
                self._stalled(nxt, arrival)

    def _finish(self, record: RequestRecord) -> None:
        self.done.append(record)
        at = record.finish_time if record.finish_time is not None else record.arrival_time
        self.pending.finished(record.request_id, at)

    def _arrive(self, request: BenchRequest, t: float) -> None:
        for r in self.replicas:
            if not r.engine.has_unfinished_requests():
                r.clock.advance_to(t)       # an idle replica waits for work
            if t - r.reported_at >= self.cluster.load_interval_s:
                self.core.on_load(r.name, replica_load(r.engine))
                self._sync_tokens(r)
                r.reported_at = t
        self._sample_balance()
        if request.prompt_len + request.output_len > self.limit:
            self._finish(failed_record(request, t, (
                f"needs {request.prompt_len + request.output_len} tokens of context; a "
                f"simulated replica holds {self.limit} (model limit or KV pool)")))
            return
        prediction = self._predict(request)
        predicted = None if prediction is None else prediction[0]
        placement = Placement(request.request_id, request.prompt_len,
                              predicted or DEFAULT_OUTPUT_LEN,
                              prefix_keys=self.core.prefix_keys(request.prompt_token_ids))
        replica = self.by_name[self.core.place(placement).name]
        params = trace_params(replica.engine.scheduler.config.max_model_len)
        try:
            replica.engine.add_request(
                request.request_id, prompt_token_ids=list(request.prompt_token_ids),
                sampling_params=params, arrival_time=t, delta=True,
                predicted_output_len=predicted, true_output_len=request.output_len)
        except ValueError as exc:
            self.core.unplace(request.request_id)
            self._finish(failed_record(request, t, str(exc)))
            return
        self.inflight[request.request_id] = (request, t, prediction)

    def _sync_tokens(self, replica: _Replica) -> None:
        """The tokens each request on ``replica`` has produced, as a live router counts
        them from the chunks it relays (here at each load report)."""
        for rid, req in replica.engine.scheduler.state.requests.items():
            placement = self.core.requests.get(rid)
            if placement is not None:
                placement.num_output_tokens = req.num_output_tokens

    def _sample_balance(self) -> None:
        counts = [len(r.engine.scheduler.state.requests) for r in self.replicas]
        mean = sum(counts) / len(counts)
        self.spread_sum += max(counts) - min(counts)
        if mean > 0:
            self.cv_sum += math.sqrt(sum((c - mean) ** 2 for c in counts) / len(counts)) / mean
        self.num_arrivals += 1

    def _predict(self, request: BenchRequest) -> tuple[int, str] | None:
        """(length, source) from the router's predictor, once; None without one."""
        if self.predictor is None:
            return None
        query = PredictQuery("", request.output_len, request.output_len)
        p = self.predictor.predict([query], self.spec.target.shape.name)[0]
        return max(1, p.length), p.source.value

    def _stalled(self, replica: _Replica, arrival: float) -> None:
        """The replica ran nothing: let time pass to the next arrival, or fail what it holds
        when none is left (a policy that can never admit them)."""
        if arrival < math.inf:
            replica.clock.advance_to(arrival)
            return
        for rid in list(replica.engine.scheduler.state.requests):
            out = replica.engine.abort_request(rid)
            request, t, _ = self.inflight.pop(rid)
            self.core.on_finished(rid)
            why = "the simulated replica made no progress (the request can never be scheduled)"
            self._finish(failed_record(request, t, why if out is None else out.error or why))

    def _record(self, out, now: float) -> RequestRecord:
        request, arrival, prediction = self.inflight.pop(out.request_id)
        self.core.on_finished(out.request_id)
        reason = out.outputs[0].finish_reason if out.outputs else None
        error = out.error or (f"finished with {reason}" if reason in ("abort", "error") else None)
        predicted, source = prediction or (None, None)
        return RequestRecord(request.request_id, request.prompt_len, request.output_len,
                             arrival, out.metrics.token_times, now, error,
                             predicted_len=predicted, prediction_source=source)


def _router_predictor(spec: SimSpec):
    """The router's predictor: one that needs no prompt text (the oracle, exact or noisy).
    None: lengths default, as a router without a predictor service places."""
    from services.predictor.local import make_predictor
    name = spec.options.predictor
    if name == "none":
        return None
    if not name.startswith("oracle"):
        raise ValueError(f"cluster mode predicts at the router from the true lengths: use "
                         f"--predictor oracle or oracle:SIGMA[:SEED], not {name!r}")
    return make_predictor(name, spec.target.shape.name, spec.options.predictor_seed)


def simulate_cluster(spec: SimSpec, cluster: ClusterSpec, workload: Workload,
                     request_rate: float, show_progress: bool = True) -> BackendRun:
    """One run of ``workload`` across the cluster; records in workload order."""
    replay = _ClusterReplay(spec, cluster, workload)
    label = f"{spec.name} x{cluster.replicas} ({cluster.router}) @ {request_rate:g} req/s"
    try:
        with tqdm(total=len(workload.requests), desc=label, unit="req",
                  disable=not show_progress) as bar, _no_cycle_collection():
            replay.run(bar)
        stats = [r.engine.stats() for r in replay.replicas]
    finally:
        for r in replay.replicas:
            r.engine.close()
    order = {r.request_id: i for i, r in enumerate(workload.requests)}
    records = sorted(replay.done, key=lambda r: order[r.request_id])
    placed = [replay.core.replicas[r.name].num_placed for r in replay.replicas]
    return BackendRun(spec.name, request_rate, replay.now, records, None,
                      {"num_preemptions": sum(s.num_preemptions for s in stats),
                       "num_iterations": sum(s.num_iterations for s in stats),
                       "prefix_cache_queries": sum(s.prefix_cache_queries for s in stats),
                       "prefix_cache_hits": sum(s.prefix_cache_hits for s in stats),
                       "affinity_placements": replay.core.num_affinity_hits,
                       "mean_request_spread": replay.spread_sum / max(replay.num_arrivals, 1),
                       "mean_request_cv": replay.cv_sum / max(replay.num_arrivals, 1),
                       "replicas": cluster.replicas, "router": cluster.router,
                       "placed_per_replica": placed})
