"""Markdown tables of benchmark runs (``{"policy", "request_rate", "summary"}`` dicts)."""
from __future__ import annotations

import itertools
import math
from collections.abc import Callable

NL = "normalized_latency_s_per_token"


def markdown(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |",
            *("| " + " | ".join(row) + " |" for row in rows)]


def policies(runs: list[dict]) -> list[str]:
    return list(dict.fromkeys(r["policy"] for r in runs))


def with_failures(value: str, summary: dict) -> str:
    """A figure over completed requests, with the requests that never completed beside it."""
    failed = summary.get("failed") or 0
    return f"{value} ({failed:.0f} failed)" if failed else value


def rate_table(runs: list[dict], key: Callable[[dict], float], fmt: str) -> list[str]:
    """One row per request rate, one column per policy; a run with failed requests says how
    many beside its figure."""
    names = policies(runs)
    cell = {(r["policy"], r["request_rate"]): with_failures(fmt.format(key(r["summary"])),
                                                             r["summary"]) for r in runs}
    rows = [[f"{rate:g}", *(cell[p, rate] if (p, rate) in cell else "-"
                            for p in names)]
            for rate in sorted({r["request_rate"] for r in runs})]
    return markdown(["rate (req/s)", *names], rows)


def sustained_rate(points: list[tuple[float, float]], limit: float) -> tuple[float, str]:
    """Highest rate whose value stays within ``limit``: linear between the last tested rate
    that meets it (all lower ones too) and the first that does not. The note is ``>=`` when
    every tested rate met it and ``<`` when none did, as the value then lies outside the
    tested range."""
    points = sorted(points)
    if not points:
        return math.nan, ""
    if not points[0][1] <= limit:
        return points[0][0], "<"
    for (r0, v0), (r1, v1) in itertools.pairwise(points):
        if not v1 <= limit:
            return r0 + (r1 - r0) * (limit - v0) / (v1 - v0), ""
    return points[-1][0], ">="


def nl_points(runs: list[dict], policy: str) -> list[tuple[float, float]]:
    """(rate, normalized latency) of a policy's runs; a run where a request failed misses
    every latency target (its normalized latency covers the completed requests only)."""
    return [(r["request_rate"], math.inf if r["summary"].get("failed") else r["summary"][NL])
            for r in runs if r["policy"] == policy]


def sustained_table(runs: list[dict], slos: list[float], base: str = "vllm") -> list[str]:
    """Per policy, the highest rate under each normalized-latency SLO and its ratio to
    ``base``'s."""
    header = ["policy"]
    for slo in slos:
        header += [f"NL <= {slo:g} s/token: rate (req/s)", f"x {base}"]
    rows = []
    for policy in policies(runs):
        row = [policy]
        for slo in slos:
            rate, note = sustained_rate(nl_points(runs, policy), slo)
            ref = sustained_rate(nl_points(runs, base), slo)[0]
            # A rate outside the tested range bounds its ratio the same way.
            row += [f"{note}{rate:.2f}", f"{note}{rate / ref:.2f}" if ref > 0 else "-"]
        rows.append(row)
    return markdown(header, rows)


def ratio_at(runs: list[dict], policy: str, base: str, rate: float) -> float:
    """``policy``'s normalized latency over ``base``'s at one rate (NaN if either is absent)."""
    nl = {r["policy"]: r["summary"][NL] for r in runs if r["request_rate"] == rate}
    return nl[policy] / nl[base] if policy in nl and base in nl and nl[base] > 0 else math.nan
