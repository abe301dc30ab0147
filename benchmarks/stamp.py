"""The stamp every result carries: which machine, when, which commit, which libraries. A figure
without it cannot be compared with a later one, so it is taken before the run starts."""
from __future__ import annotations

import datetime as dt
import importlib.metadata
import os
import platform
import resource
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LIBRARIES = ("lenserve", "torch", "transformers", "numpy", "sentence-transformers",
             "qdrant-client")


def cpu_model() -> str:
    """The CPU's marketing name from /proc/cpuinfo (Linux), else what platform knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def gpu_name() -> str:
    """The first CUDA device's name, or "none". torch is imported only here, lazily: a
    simulated benchmark must not pay for it when torch is absent."""
    try:
        import torch
    except ImportError:
        return "none"
    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"


def commit(repo: Path = REPO) -> str:
    """``git rev-parse --short HEAD``, plus ``-dirty`` when tracked files differ from it
    (untracked files do not change what the commit's code does, and neither do the results
    the benchmarks themselves write, so one command's outputs do not mark the next dirty)."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True,
                              check=True).stdout.strip()
    try:
        head = git("rev-parse", "--short", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no", "--", ".",
                    ":(exclude)docs/results.md", ":(exclude)docs/results")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("-dirty" if dirty else "")


def versions() -> dict[str, str]:
    found = {"python": platform.python_version()}
    for name in LIBRARIES:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = "absent"
    return found


def load_average() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def busy_cpu_s() -> float | None:
    """CPU seconds every process of the machine has run since boot (/proc/stat; Linux only)."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]
    except OSError:
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields)
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def own_cpu_s() -> float:
    """CPU seconds of this process and of the children it has waited for (the commands)."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(
        resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def take() -> dict:
    """The stamp at the start of a run; ``finish`` adds what is known only at its end."""
    return {"date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "commit": commit(),
            "machine": {"cpu": cpu_model(), "cores": os.cpu_count(), "gpu": gpu_name(),
                        "load_average_start": load_average()},
            "versions": versions(),
            "_cpu_start": (busy_cpu_s(), own_cpu_s())}


def finish(stamp: dict, wall_s: float) -> dict:
    """The stamp with the run's wall time and how many cores other work kept busy meanwhile
    (the machine's busy CPU time less this run's own, over the wall time): the figure that
    says whether a timing was taken on a shared CPU."""
    stamp = dict(stamp)
    busy0, own0 = stamp.pop("_cpu_start")
    busy1, own1 = busy_cpu_s(), own_cpu_s()
    others = None
    if busy0 is not None and busy1 is not None and wall_s > 0:
        others = round(max(0.0, (busy1 - busy0) - (own1 - own0)) / wall_s, 2)
    machine = {**stamp["machine"], "load_average_end": load_average(),
               "other_work_cores": others}
    return {**stamp, "machine": machine, "wall_s": round(wall_s, 1)}


def describe(stamp: dict) -> str:
    """One line of markdown for the page."""
    m, v = stamp["machine"], stamp["versions"]
    libs = ", ".join(f"{k} {v[k]}" for k in v)
    others = ""
    if m.get("other_work_cores") is not None:
        others = f"; other work kept {m['other_work_cores']:.2f} of the cores busy meanwhile"
    return (f"Ran {stamp['date']} on {m['cpu']} ({m['cores']} cores, GPU: {m['gpu']}), "
            f"commit `{stamp['commit']}`, in {stamp['wall_s'] / 60:.1f} min{others}; {libs}.")


def cpu_was_shared(stamp: dict, threshold_cores: float = 0.25) -> bool:
    """Whether other work took a noticeable share of the CPU during the run (on average more
    than a quarter of a core), which slows timing-sensitive runs."""
    others = stamp["machine"].get("other_work_cores")
    return others is not None and others > threshold_cores
