"""What a simulated iteration costs besides the device: the scheduler's CPU time and the
length predictor's latency, per policy, *measured on the real engine* (``python3
benchmarks/sim_overheads.py`` writes ``data/overheads.json``, stamped with the machine, date
and commit). Without them a simulation gives length-aware policies their bookkeeping and
their predictions for free.

* Scheduler: ``intercept_s + per_seq_s * sequences in the batch`` per iteration (schedule,
  KV bookkeeping, update and outputs of ``EngineCore.step`` on the CPU), added to the
  device's time: the loop waits for the scheduler before it launches the next iteration,
  as in vLLM V0 and in lenserve's engine.
* Predictor: ``latency_s`` per request, served one at a time on the predictor's thread, so a
  request is ranked by its prediction only once that has landed (``DelayedPredictions``).
* INT8 codec: device bytes per second of quantizing (copy out) and dequantizing (copy in) on
  the device; the simulated host tier charges it and moves the packed INT8 bytes.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

DATA = Path(__file__).parent / "data" / "overheads.json"


@dataclass(frozen=True)
class SchedulerOverhead:
    intercept_s: float
    per_seq_s: float

    def seconds(self, num_seqs: int) -> float:
        return self.intercept_s + self.per_seq_s * num_seqs


@dataclass(frozen=True)
class Overheads:
    scheduler: dict[str, SchedulerOverhead]
    predictor_latency_s: dict[str, float]     # predictor spec ("embedded") -> seconds
    int8_codec_bytes_per_s: float | None      # CPU executor: measured; GPU: see host_tier
    source: str

    def scheduler_for(self, policy: str) -> SchedulerOverhead | None:
        return self.scheduler.get(policy)

    def predictor_for(self, spec: str) -> float:
        """The oracle is an ideal predictor (the paper's Oracle): no latency."""
        return self.predictor_latency_s.get(spec.split(":", 1)[0], 0.0)


def load(path: Path | str = DATA) -> Overheads | None:
    """None when nothing was measured yet (the simulation then says so in its notes)."""
    path = Path(path)
    if not path.exists():
        return None
    data = json.loads(path.read_text())
    meta = data.get("meta", {})
    if "source" in meta:        # a file that names its own figures' provenance
        source = meta["source"]
    else:
        source = (f"measured on the real engine by benchmarks/sim_overheads.py on "
                  f"{meta.get('machine', '?')} ({meta.get('date', 'undated')}, "
                  f"{meta.get('commit', '?')})")
    return Overheads(
        {p: SchedulerOverhead(v["intercept_s"], v["per_seq_s"])
         for p, v in data["scheduler"].items()},
        dict(data.get("predictor_latency_s", {})), data.get("int8_codec_bytes_per_s"), source)


class DelayedPredictions:
    """A ``PredictionPump`` in virtual time, whatever the real thread took: as the pump does,
    the predictor takes up every request queued while it was busy as one batch, and a batch
    lands ``latency_s`` after it started (the latency of one prompt: a batch of several is
    taken to cost no more, which favours the predictor under load)."""

    def __init__(self, pump, clock, latency_s: float):
        self._pump, self._clock, self.latency_s = pump, clock, latency_s
        self._ready: dict[str, float] = {}
        self._held: list[tuple[float, str, object]] = []
        self._batch_end = 0.0               # the running batch lands then...
        self._next_end: float | None = None  # ...and the one queued behind it then

    def submit(self, request_id: str, query) -> None:
        now = self._clock.now
        if self._next_end is not None and now >= self._batch_end:
            self._batch_end, self._next_end = self._next_end, None     # the queued one started
        if now >= self._batch_end:
            self._batch_end = now + self.latency_s          # an idle predictor starts at once
            self._ready[request_id] = self._batch_end
        else:
            if self._next_end is None:
                self._next_end = self._batch_end + self.latency_s
            self._ready[request_id] = self._next_end
        self._pump.submit(request_id, query)

    def drain(self):
        now = self._clock.now
        self._held += [(self._ready.pop(rid, now), rid, p) for rid, p in self._pump.drain()]
        due = [(rid, p) for t, rid, p in self._held if t <= now]
        self._held = [h for h in self._held if h[0] > now]
        return due

    def __getattr__(self, name):
        return getattr(self._pump, name)
