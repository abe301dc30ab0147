"""Keeps a set of service processes running: starts them in order, restarts one that exits,
reports it, and stops them all (SIGTERM, then SIGKILL after a grace period). On Linux each
child is also told to stop when the supervisor dies, however it dies: a supervisor killed with
SIGKILL runs no cleanup, and its children would otherwise serve on, orphaned.

The polling decisions are separate from process handling (``spawn`` is injected), so the
restart rules are tested without real processes."""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

PR_SET_PDEATHSIG = 1     # <linux/prctl.h>


@dataclass(frozen=True)
class ServiceSpec:
    name: str
    argv: tuple[str, ...]
    url: str                      # what the user is told to connect to
    health: Callable[[], bool] | None = None   # ready check (None: ready once started)
    env: tuple[tuple[str, str], ...] = ()      # set in the child's environment (a secret
    #                                            stays out of its argv, which `ps` shows)


@dataclass
class _Running:
    spec: ServiceSpec
    proc: subprocess.Popen
    restarts: int = 0
    down_since: float | None = None
    history: list[float] = field(default_factory=list)


class Supervisor:
    def __init__(self, specs: list[ServiceSpec], *, spawn: Callable = subprocess.Popen,
                 report: Callable[[str], None] = print, clock: Callable[[], float] = time.monotonic,
                 max_backoff_s: float = 10.0):
        self.specs = specs
        self._spawn = partial_spawn(spawn)
        self.report = report
        self.clock = clock
        self.max_backoff_s = max_backoff_s
        self.running: dict[str, _Running] = {}

    def start_all(self, ready_timeout_s: float = 120.0) -> None:
        """Start each service and wait until it is healthy before the next (start order)."""
        for spec in self.specs:
            self.running[spec.name] = _Running(spec, self._spawn(spec))
            self.wait_ready(spec, ready_timeout_s)

    def wait_ready(self, spec: ServiceSpec, timeout_s: float) -> None:
        deadline = self.clock() + timeout_s
        while spec.health is not None and not spec.health():
            proc = self.running[spec.name].proc
            if proc.poll() is not None:
                raise RuntimeError(f"{spec.name} exited with status {proc.returncode} "
                                   "while starting (its log is above)")
            if self.clock() > deadline:
                raise RuntimeError(f"{spec.name} did not become healthy in {timeout_s:.0f} s")
            time.sleep(0.1)

    def poll(self) -> list[str]:
        """Restart services that exited; returns the names restarted now."""
        restarted = []
        for run in self.running.values():
            code = run.proc.poll()
            if code is None:
                continue
            now = self.clock()
            if run.down_since is None:
                run.down_since = now
                self.report(f"lenserve up: {run.spec.name} exited ({_describe(code)}); "
                            f"restarting in {self._backoff(run):.1f} s")
            if now - run.down_since >= self._backoff(run):
                self._restart(run, now)
                restarted.append(run.spec.name)
        return restarted

    def _backoff(self, run: _Running) -> float:
        """0.5 s, doubling with each restart in the last minute (a crash loop slows down)."""
        recent = [t for t in run.history if self.clock() - t < 60.0]
        return min(self.max_backoff_s, 0.5 * 2 ** len(recent))

    def _restart(self, run: _Running, now: float) -> None:
        run.proc = self._spawn(run.spec)
        run.restarts += 1
        run.history.append(now)
        run.down_since = None
        self.report(f"lenserve up: {run.spec.name} restarted (pid {run.proc.pid}, "
                    f"restart {run.restarts})")

    def stop_all(self, grace_s: float = 10.0) -> None:
        """SIGTERM in reverse start order (fronts first), SIGKILL what is left after grace."""
        procs = [r.proc for r in reversed(list(self.running.values()))]
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for proc in procs:
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _describe(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"status {code}"


def partial_spawn(spawn: Callable) -> Callable[[ServiceSpec], subprocess.Popen]:
    """``spawn(argv, env=..., preexec_fn=...)`` for a spec: its environment on top of ours,
    and, where the platform has it, death with the supervisor."""
    def start(spec: ServiceSpec):
        env = {**os.environ, **dict(spec.env)} if spec.env else None
        return spawn(list(spec.argv), env=env, preexec_fn=die_with_parent())
    return start


def die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` that has Linux send the child SIGTERM when this process dies (the
    parent-death signal survives the exec; the child's own SIGTERM handling then shuts it
    down cleanly). None where there is no ``prctl``. The signal follows the *thread* that
    forked, so children are spawned from the main thread only. libc's ``prctl`` is looked up
    here, not in the child, where a forked copy of a threaded process should do no more than
    one plain system call."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent, sigterm = os.getpid(), int(signal.SIGTERM)

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, sigterm)
        if os.getppid() != parent:      # the parent died before the signal was asked for
            os.kill(os.getpid(), sigterm)
    return preexec


def python_module(module: str, *args: str) -> tuple[str, ...]:
    return (sys.executable, "-m", module, *args)
