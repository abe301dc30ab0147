"""The side-by-side table, the JSON result file and the normalized-latency figure."""
from __future__ import annotations

import json
import math
import uuid
from collections.abc import Sequence
from pathlib import Path

from lenserve.bench.metrics import JctSlo, summarize
from lenserve.bench.runner import BackendRun

# (label, path into the summary, format); the latency rows follow vllm bench serve's order.
_ROWS: list[tuple[str, tuple[str, ...], str]] = [
    ("Successful requests", ("completed",), "{:.0f}"),
    ("Failed requests", ("failed",), "{:.0f}"),
    ("Output length mismatches", ("length_mismatches",), "{:.0f}"),
    ("Benchmark duration (s)", ("duration_s",), "{:.2f}"),
    ("Total input tokens", ("total_input_tokens",), "{:.0f}"),
    ("Total generated tokens", ("total_output_tokens",), "{:.0f}"),
    ("Request throughput (req/s)", ("request_throughput",), "{:.2f}"),
    ("Output token throughput (tok/s)", ("output_throughput",), "{:.2f}"),
    *[(f"{stat.capitalize() if stat != 'p99' else 'P99'} {name.upper()} (ms)", (f"{name}_ms", stat),
       "{:.2f}") for name in ("ttft", "tpot", "itl", "e2el", "jct")
      for stat in ("mean", "median", "p99")],
    ("Normalized latency (s/token)", ("normalized_latency_s_per_token",), "{:.4f}"),
    ("Mean latency bound (ms)", ("latency_bound_ms", "mean"), "{:.2f}"),
    ("P99 latency bound (ms)", ("latency_bound_ms", "p99"), "{:.2f}"),
    ("Max latency bound (ms)", ("latency_bound_ms", "max"), "{:.2f}"),
    ("Goodput (req/s)", ("goodput",), "{:.2f}"),
    ("SLO attainment (%)", ("slo_attainment",), "{:.1%}"),
    ("SLO satisfaction ratio (%)", ("slo_satisfaction_ratio",), "{:.1%}"),
    ("Longest wait for a first token (ms)", ("max_ttft_ms",), "{:.2f}"),
    ("Preemptions", ("num_preemptions",), "{:.0f}"),
    ("KV allocated (%)", ("kv_allocated_util",), "{:.1%}"),
    ("KV holding tokens (%)", ("kv_used_util",), "{:.1%}"),
    ("KV lent to guests (%)", ("kv_lent_util",), "{:.1%}"),
    ("Allocation failures (decode steps)", ("num_allocation_failures",), "{:.0f}"),
    ("Requests that met an allocation failure (%)", ("allocation_failure_share",), "{:.1%}"),
    ("Guests started in lent KV", ("num_hosted",), "{:.0f}"),
    ("Prefilled prompts dropped for the head", ("num_forced",), "{:.0f}"),
    ("Scheduler time per iteration (ms, wall)", ("schedule_ms_per_iteration",), "{:.3f}"),
    ("Scheduler share of JCT (%)", ("schedule_share",), "{:.2%}"),
    ("Prefix cache hit rate (%)", ("prefix_cache_hit_rate",), "{:.1%}"),
    ("Cached prompt tokens", ("prefix_cache_hits",), "{:.0f}"),
    ("  of them from the host tier", ("prefix_cache_host_hits",), "{:.0f}"),
    ("Upload waits (swap-ins waited for)", ("num_upload_waits",), "{:.0f}"),
    ("Uploads ahead of need", ("num_uploads_ahead",), "{:.0f}"),
]


def _lookup(summary: dict, path: tuple[str, ...]) -> float | None:
    value = summary
    for key in path:
        if not isinstance(value, dict) or key not in value:
            return None
        value = value[key]
    return value


def _cell(value: float | None, fmt: str) -> str:
    if value is None:
        return None
    return "-" if isinstance(value, float) and math.isnan(value) else fmt.format(value)


def format_table(summaries: dict[str, dict], title: str) -> str:
    """One column per backend; rows absent from every summary (goodput without SLOs) are left out."""
    names = list(summaries)
    rows = []
    for label, path, fmt in _ROWS:
        cells = [_cell(_lookup(summaries[n], path), fmt) for n in names]
        if any(c is not None for c in cells):
            rows.append([label] + [c or "-" for c in cells])
    widths = [max(len(r[i]) for r in rows + [[title] + names]) for i in range(len(names) + 1)]
    lines = [_join(cells, widths) for cells in [[title, *names], *rows]]
    rule = "=" * len(lines[0])
    return "\n".join([rule, lines[0], rule, *lines[1:], rule])


def _join(cells: list[str], widths: list[int]) -> str:
    return "  ".join(c.ljust(widths[0]) if i == 0 else c.rjust(widths[i]) for i, c in enumerate(cells))


def summarize_runs(runs: Sequence[BackendRun], slos: dict[str, float],
                   jct_slo: JctSlo | None = None) -> list[dict]:
    """Each run's summary. A ``jct_slo`` without tp and tg takes them from the reference
    run: the first backend's at its lowest request rate (the least loaded)."""
    if jct_slo is not None and runs:
        jct_slo = jct_slo.with_reference(reference_run(runs).records)
    return [{"backend": run.backend, "request_rate": run.request_rate,
             "summary": {**summarize(run.records, run.duration_s, slos, jct_slo),
                         **(run.stats or {})}} for run in runs]


def reference_run(runs: Sequence[BackendRun]) -> BackendRun:
    first = [run for run in runs if run.backend == runs[0].backend]
    return min(first, key=lambda run: run.request_rate)


def format_report(results: list[dict]) -> str:
    """A table per request rate, backends side by side."""
    rates = sorted({r["request_rate"] for r in results})
    tables = []
    for rate in rates:
        summaries = {r["backend"]: r["summary"] for r in results if r["request_rate"] == rate}
        tables.append(format_table(summaries, f"request rate {rate:g} req/s"))
    return "\n\n".join(tables)


def write_json(path: str | Path, config: dict, results: list[dict], runs: Sequence[BackendRun],
               records: bool = True) -> None:
    """The config, each run's summary, and each run's per-request records, one per line:
    indenting every token time made large runs' files long and slow to write."""
    marker = f"@requests-{uuid.uuid4().hex}@"
    entries = [{**result, "setup": run.setup,
                "profile": run.profile.as_dict() if run.profile else None,
                "requests": marker} for result, run in zip(results, runs)]
    head = json.dumps(_plain({"config": config, "runs": entries}), indent=1, default=str)
    parts = head.split(json.dumps(marker))
    assert len(parts) == len(runs) + 1, "the records' marker appears in the config"
    with open(path, "w") as f:
        f.write(parts[0])
        for run, rest in zip(runs, parts[1:]):
            f.write("[")
            for i, rec in enumerate(run.records if records else ()):
                f.write(",\n" if i else "\n")
                f.write(json.dumps(_plain(rec.to_json()), default=str))
            f.write("\n]" if run.records and records else "]")
            f.write(rest)


def format_profiles(runs: Sequence[BackendRun]) -> str:
    """One line per run that kept a step profile: where its time went."""
    return "\n".join(f"profile {run.backend} @ {run.request_rate:g} req/s: {run.profile.summary()}"
                     for run in runs if run.profile is not None)


def _plain(value):
    """Strict JSON: NaN (no data) becomes null and an infinite rate the string "inf", as vLLM."""
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return value if _finite_numbers(value) else [_plain(v) for v in value]
    return value


def _finite_numbers(values) -> bool:
    """All plain finite numbers (token times): a sum that is finite has no NaN or infinity in
    it, so such a list is written as it is, without a call per element."""
    try:
        return math.isfinite(sum(values))
    except (TypeError, OverflowError):
        return False


def plot_normalized_latency(path: str | Path, results: list[dict], title: str | None = None,
                            log_y: bool = False, dpi: int = 120) -> None:
    """Normalized latency against request rate, one line per backend (the papers' main figure);
    ``log_y`` keeps the light-load values readable beside overload."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for backend in dict.fromkeys(r["backend"] for r in results):
        points = sorted((r["request_rate"], r["summary"]["normalized_latency_s_per_token"])
                        for r in results if r["backend"] == backend and math.isfinite(r["request_rate"]))
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=backend)
    ax.set_xlabel("request rate (req/s)")
    ax.set_ylabel("normalized latency (s/token)")
    if log_y:
        ax.set_yscale("log")
    if title:
        ax.set_title(title, fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
