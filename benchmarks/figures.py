"""The normalized-latency figure of the policy benchmarks. Unlike the bench's own sweep figure
it gives each of up to a dozen policies its own colour and marker, so lines that coincide
(policies equal at light load) stay tellable apart."""
from __future__ import annotations

import math
from pathlib import Path

from benchmarks.tables import NL, policies

MARKERS = "osD^vP*Xh<>p"


def nl_vs_rate(path: Path, runs: list[dict], title: str, log_y: bool = False) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = policies(runs)
    colors = [*plt.get_cmap("tab10").colors, "black", "gold"]
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for i, name in enumerate(names):
        points = sorted((r["request_rate"], r["summary"][NL]) for r in runs
                        if r["policy"] == name and math.isfinite(r["request_rate"]))
        ax.plot(*zip(*points), marker=MARKERS[i % len(MARKERS)], color=colors[i % len(colors)],
                label=name, markersize=5, linewidth=1.2, alpha=0.9)
    ax.set_xlabel("request rate (req/s)")
    ax.set_ylabel("normalized latency (s/token)")
    if log_y:
        ax.set_yscale("log")
    ax.set_title(title, fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    save(fig, path)


def save(fig, path: Path) -> None:
    """Every figure of the page: laid out, written at the page's resolution, then closed."""
    import matplotlib.pyplot as plt
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
