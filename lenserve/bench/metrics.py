"""Serving metrics with ``vllm bench serve``'s definitions, plus the papers' own.

vLLM: TTFT = first token - arrival; E2EL = last token - arrival; TPOT = (E2EL - TTFT) /
(output tokens - 1), per request with more than one token; ITL = every gap between consecutive
tokens of a request, pooled over requests; goodput = requests meeting every ``--goodput`` SLO
per second of the run. Papers: normalized latency = mean over requests of E2EL / output
tokens (ALISE, EconoServe after vLLM); latency bound = the largest gap between two tokens of
one request (FluidInfer); JCT = arrival to completion as the client sees it (EconoServe),
which exceeds E2EL when a backend hands results back later than it makes tokens; SLO
satisfaction ratio (SSR, EconoServe) = the share of requests whose JCT is within
SLO-scale x (tp + tg x output tokens), failed requests counted as missing it.
"""
from __future__ import annotations

import math
from itertools import chain
from collections.abc import Sequence
from dataclasses import dataclass, field, fields, replace

import numpy as np

GOODPUT_METRICS = ("ttft", "tpot", "e2el")


@dataclass
class RequestRecord:
    """What one request did, in seconds since the start of the run."""

    request_id: str
    prompt_len: int
    output_len: int  # tokens asked for
    arrival_time: float
    token_times: list[float] = field(default_factory=list)
    finish_time: float | None = None
    error: str | None = None
    # Tokens generated, when a stream delivers several per timed chunk (HTTP backends);
    # otherwise one token per entry of token_times.
    num_tokens: int | None = None
    predicted_len: int | None = None        # the length predictor's answer, if one ran
    prediction_source: str | None = None    # retrieval | mlp | default | oracle | given

    @property
    def success(self) -> bool:
        return self.error is None and bool(self.token_times)

    @property
    def num_output_tokens(self) -> int:
        return self.num_tokens if self.num_tokens is not None else len(self.token_times)

    @property
    def ttft(self) -> float:
        return self.token_times[0] - self.arrival_time

    @property
    def e2el(self) -> float:
        return self.token_times[-1] - self.arrival_time

    @property
    def itls(self) -> list[float]:
        return np.diff(self.token_times).tolist()

    @property
    def tpot(self) -> float | None:
        n = self.num_output_tokens
        return (self.e2el - self.ttft) / (n - 1) if n > 1 else None

    @property
    def jct(self) -> float:
        end = self.finish_time if self.finish_time is not None else self.token_times[-1]
        return end - self.arrival_time

    def shifted(self, origin: float) -> RequestRecord:
        """The same record with times measured from ``origin`` (every other field kept)."""
        return replace(self, arrival_time=self.arrival_time - origin,
                       token_times=[t - origin for t in self.token_times],
                       finish_time=None if self.finish_time is None else self.finish_time - origin)

    def to_json(self) -> dict:
        # Fields copied one level deep (asdict deep-copies every token time).
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        data["token_times"] = list(self.token_times)
        if self.success:
            data.update(ttft=self.ttft, tpot=self.tpot, e2el=self.e2el, jct=self.jct,
                        latency_bound=max(self.itls, default=0.0))
        return data


def parse_goodput(items: Sequence[str] | None) -> dict[str, float]:
    """``["ttft:500", "tpot:50"]`` -> SLOs in milliseconds, as ``vllm bench serve --goodput``."""
    slos: dict[str, float] = {}
    for item in items or []:
        name, sep, value = item.partition(":")
        if not sep or name not in GOODPUT_METRICS:
            raise ValueError(f"bad --goodput item {item!r}: expected KEY:MS with KEY one of "
                             f"{', '.join(GOODPUT_METRICS)}")
        try:
            slos[name] = float(value)
        except ValueError:
            raise ValueError(f"bad --goodput value in {item!r}: {value!r} is not a number") from None
        if not slos[name] > 0:
            raise ValueError(f"--goodput {name} must be > 0 ms, got {value}")
    return slos


@dataclass(frozen=True)
class JctSlo:
    """EconoServe's per-request JCT SLO, ``scale x (tp + tg x l)`` for a request of ``l``
    output tokens: tp is the average prompt processing latency and tg the average token
    generation latency measured for the dataset (the paper's §4; scale 2 by default there).
    Without tp and tg they are taken from a reference run (``with_reference``)."""

    scale: float
    prompt_s: float | None = None     # tp
    token_s: float | None = None      # tg

    @property
    def resolved(self) -> bool:
        return self.prompt_s is not None and self.token_s is not None

    def limit_s(self, num_output_tokens: int) -> float:
        return self.scale * (self.prompt_s + self.token_s * num_output_tokens)

    def with_reference(self, records: Sequence[RequestRecord]) -> JctSlo:
        """tp and tg measured on ``records`` (mean TTFT and mean TPOT of the successful ones),
        unless already set."""
        if self.resolved:
            return self
        ok = [r for r in records if r.success]
        tpots = [r.tpot for r in ok if r.tpot is not None]
        if not ok or not tpots:
            raise ValueError("the JCT SLO's reference run has no successful multi-token request")
        return JctSlo(self.scale, float(np.mean([r.ttft for r in ok])), float(np.mean(tpots)))

    def as_dict(self) -> dict:
        return {"scale": self.scale, "tp_ms": self.prompt_s * 1e3, "tg_ms": self.token_s * 1e3}


def parse_jct_slo(text: str | None) -> JctSlo | None:
    """``SCALE`` or ``SCALE:TP_MS:TG_MS`` (``--jct-slo``)."""
    if not text:
        return None
    parts = text.split(":")
    try:
        values = [float(p) for p in parts]
    except ValueError:
        values = []
    if len(values) not in (1, 3) or not all(v > 0 and math.isfinite(v) for v in values):
        raise ValueError(f"bad --jct-slo {text!r}: expected SCALE or SCALE:TP_MS:TG_MS, "
                         "all > 0")
    if len(values) == 1:
        return JctSlo(values[0])
    return JctSlo(values[0], values[1] / 1e3, values[2] / 1e3)


def slo_satisfaction_ratio(records: Sequence[RequestRecord], slo: JctSlo) -> float:
    """Share of ``records`` that finished within their JCT SLO (a failed one never does)."""
    if not records:
        return math.nan
    met = sum(r.success and r.jct <= slo.limit_s(r.num_output_tokens) for r in records)
    return met / len(records)


def meets_slos(record: RequestRecord, slos: dict[str, float]) -> bool:
    values = {"ttft": record.ttft, "tpot": record.tpot or 0.0, "e2el": record.e2el}
    return all(values[name] * 1000.0 <= limit for name, limit in slos.items())


def _stats(values_s: Sequence[float]) -> dict[str, float]:
    """mean, median and p99 in milliseconds (NaN when there are no values)."""
    if not len(values_s):
        return {"mean": math.nan, "median": math.nan, "p99": math.nan}
    ms = np.asarray(values_s, dtype=float) * 1000.0
    # One partition for both (the pooled token gaps of a long run are tens of millions).
    median, p99 = np.percentile(ms, [50, 99])
    return {"mean": float(ms.mean()), "median": float(median), "p99": float(p99)}


def _token_gaps(ok: Sequence[RequestRecord]) -> tuple[np.ndarray, np.ndarray]:
    """Every gap between consecutive tokens of a request, pooled in record order, and each
    request's largest gap (0 for a one-token request). ``ok`` records have a token each.
    One array for all the token times, diffed once: per-request arrays cost seconds on
    100,000-request runs (34 M tokens)."""
    if not ok:
        return np.empty(0), np.empty(0)
    lens = np.fromiter((len(r.token_times) for r in ok), dtype=np.int64, count=len(ok))
    flat = np.fromiter(chain.from_iterable(r.token_times for r in ok), dtype=float,
                       count=int(lens.sum()))
    ends = np.cumsum(lens)
    keep = np.ones(max(flat.size - 1, 0), dtype=bool)
    keep[ends[:-1] - 1] = False         # the step from one request's last token to the next's
    itls = np.diff(flat)[keep]
    counts = lens - 1
    bounds = np.zeros(len(ok))
    has = counts > 0
    if has.any():
        starts = (np.cumsum(counts) - counts)[has]
        bounds[has] = np.maximum.reduceat(itls, starts)
    return itls, bounds


def summarize(records: Sequence[RequestRecord], duration_s: float,
              slos: dict[str, float] | None = None, jct_slo: JctSlo | None = None) -> dict:
    """The per-backend summary: counts, throughputs and latency statistics; SSR with a
    resolved ``jct_slo``."""
    ok = [r for r in records if r.success]
    out_tokens = sum(r.num_output_tokens for r in ok)
    duration = max(duration_s, 1e-9)
    itls, bounds = _token_gaps(ok)
    summary = {
        "completed": len(ok), "failed": len(records) - len(ok), "duration_s": duration_s,
        # Requests whose output length differs from the one asked for: every backend must do
        # the same work for the comparison to hold.
        "length_mismatches": sum(r.num_output_tokens != r.output_len for r in ok),
        "total_input_tokens": sum(r.prompt_len for r in ok), "total_output_tokens": out_tokens,
        "request_throughput": len(ok) / duration, "output_throughput": out_tokens / duration,
        "ttft_ms": _stats([r.ttft for r in ok]),
        # The longest any completed request waited for its first token (failed ones never
        # got one: they are in "failed").
        "max_ttft_ms": max((r.ttft for r in ok), default=math.nan) * 1000.0,
        "tpot_ms": _stats([r.tpot for r in ok if r.tpot is not None]),
        "itl_ms": _stats(itls),
        "e2el_ms": _stats([r.e2el for r in ok]),
        "jct_ms": _stats([r.jct for r in ok]),
        "latency_bound_ms": {**_stats(bounds),
                             "max": float(bounds.max()) * 1000.0 if bounds.size else math.nan},
        "normalized_latency_s_per_token": (float(np.mean([r.e2el / r.num_output_tokens for r in ok]))
                                           if ok else math.nan),
    }
    if slos:
        good = sum(meets_slos(r, slos) for r in ok)
        summary.update(goodput=good / duration, slo_attainment=good / max(len(records), 1))
    if jct_slo is not None and jct_slo.resolved:
        summary.update(slo_satisfaction_ratio=slo_satisfaction_ratio(records, jct_slo),
                       jct_slo=jct_slo.as_dict())
    return summary
