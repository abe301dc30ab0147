"""Where the engine's time goes, step by step: the figures behind the benchmark's profile."""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from services.executor.types import IterationTimings


@dataclass
class StepProfile:
    """Cumulative seconds over the engine's steps. ``executor_s`` is the executor call as the
    engine sees it; of it, ``forward_s`` is the model forward (``attention_s`` its attention
    part, measured on CPU only) and ``sample_s`` sampling. What is left of ``step_s`` after
    scheduling, the executor and the update is Python overhead of the loop itself. ``kv_s``
    is time the loop spent starting swaps and waiting for swap-ins (swap-outs overlap the
    iteration); predictions and completion reports run on another thread and are not here."""

    steps: int = 0
    step_s: float = 0.0
    schedule_s: float = 0.0
    executor_s: float = 0.0
    forward_s: float = 0.0
    attention_s: float = 0.0
    sample_s: float = 0.0
    update_s: float = 0.0       # folding results back, stop checks, detokenizing outputs
    kv_s: float = 0.0           # swap starts and swap-in waits on the loop
    predictor_s: float = 0.0    # prediction/observe work on the predictor thread (off the loop)

    def add(self, schedule_s: float, executor_s: float, timings: IterationTimings,
            update_s: float, step_s: float, kv_s: float = 0.0) -> None:
        self.steps += 1
        self.step_s += step_s
        self.schedule_s += schedule_s
        self.executor_s += executor_s
        self.forward_s += timings.forward_s
        self.attention_s += timings.attention_s
        self.sample_s += timings.sample_s
        self.update_s += update_s
        self.kv_s += kv_s

    def since(self, earlier: StepProfile) -> StepProfile:
        return StepProfile(*(getattr(self, f.name) - getattr(earlier, f.name)
                             for f in fields(self)))

    def as_dict(self) -> dict[str, float]:
        out = asdict(self)
        out["other_s"] = (self.step_s - self.schedule_s - self.executor_s - self.update_s
                          - self.kv_s)
        out.pop("predictor_s")
        out["predictor_offloop_s"] = self.predictor_s
        return out

    def summary(self) -> str:
        if not self.step_s:
            return "no steps"
        d = self.as_dict()
        parts = ["forward_s", "attention_s", "sample_s", "schedule_s", "kv_s", "update_s",
                 "other_s"]
        share = ", ".join(f"{k[:-2]} {100 * d[k] / self.step_s:.1f}%" for k in parts)
        text = (f"{self.steps} steps, {1e3 * self.step_s / self.steps:.1f} ms/step: {share} "
                f"(attention is part of forward)")
        if self.predictor_s:
            text += f"; predictor thread {self.predictor_s:.2f}s off the loop"
        return text
