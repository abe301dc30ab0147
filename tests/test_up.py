"""``lenserve up``: the restart rules on fake processes, and the real thing end to end."""
from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from functools import partial
from pathlib import Path

import pytest

from lenserve.entrypoints.supervisor import ServiceSpec, Supervisor
from lenserve_contract.sampling_params import SamplingParams

ROOT = Path(__file__).resolve().parent.parent


class FakeProc:
    count = 0

    def __init__(self, argv):
        FakeProc.count += 1
        self.pid, self.returncode = FakeProc.count, None

    def poll(self):
        return self.returncode


def test_a_dead_service_is_reported_and_restarted_with_backoff():
    now, reports = [0.0], []
    sup = Supervisor([ServiceSpec("executor", ("x",), "grpc://h:1")], spawn=FakeProc,
                     report=reports.append, clock=lambda: now[0])
    sup.start_all()
    sup.running["executor"].proc.returncode = -9
    assert sup.poll() == [] and "killed by SIGKILL" in reports[-1]
    now[0] = 0.6
    assert sup.poll() == ["executor"] and "restarted" in reports[-1]
    sup.running["executor"].proc.returncode = 1      # a crash loop waits longer each time
    now[0] = 1.0
    assert sup.poll() == []
    now[0] = 1.6
    assert sup.poll() == []
    now[0] = 2.1
    assert sup.poll() == ["executor"] and sup.running["executor"].restarts == 2


def test_swap_space_adds_a_kvmanager_between_executor_and_scheduler():
    from lenserve.cli import build_parser
    from lenserve.commands.up import build_specs

    def specs(*flags):
        args = build_parser().parse_args(["up", "--model", "fake", "--no-predictor", *flags])
        return {s.name: s for s in build_specs(args)}, [s.name for s in build_specs(args)]

    by_name, order = specs()
    assert "kvmanager" not in by_name and "--kvmanager" not in by_name["scheduler"].argv
    by_name, order = specs("--swap-space", "0.5", "--kv-int8")
    assert order.index("executor") < order.index("kvmanager") < order.index("scheduler")
    kv = by_name["kvmanager"].argv
    assert kv[kv.index("--executor") + 1] == by_name["executor"].url and "--int8" in kv
    sched = by_name["scheduler"].argv
    assert sched[sched.index("--kvmanager") + 1] == by_name["kvmanager"].url


def _lines(proc) -> queue.Queue:
    q: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [q.put(line) for line in proc.stdout], daemon=True).start()
    return q


def _wait_for(q: queue.Queue, pattern: str, timeout_s: float) -> list[str]:
    seen, deadline = [], time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            line = q.get(timeout=0.5)
        except queue.Empty:
            continue
        seen.append(line)
        if re.search(pattern, line):
            return seen
    raise AssertionError(f"no {pattern!r} in {timeout_s} s; got {''.join(seen)}")


def _generate_until_ok(target: str, timeout_s: float):
    from lenserve.client import Client
    deadline = time.monotonic() + timeout_s
    with Client(target, retries=5) as client:
        while True:
            out = client.generate_all("hello", SamplingParams(max_tokens=4, temperature=0))
            if out.outputs[0].finish_reason == "length" or time.monotonic() > deadline:
                return out
            time.sleep(0.5)


def _openai_chat_and_stream(url: str) -> None:
    """The standard OpenAI client through the gateway, gRPC scheduler and gRPC executor."""
    from openai import OpenAI
    client = OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    assert [m.id for m in client.models.list().data] == ["fake"]
    chat = client.chat.completions.create(model="fake", max_tokens=5,
                                          messages=[{"role": "user", "content": "hi"}])
    assert chat.usage.completion_tokens == 5 and chat.choices[0].finish_reason == "length"
    chunks = client.completions.create(model="fake", prompt="Hello", max_tokens=4, stream=True)
    assert len("".join(c.choices[0].text for c in chunks if c.choices)) == 4



def _start_up(*flags: str):
    """``lenserve up --model fake FLAGS`` from this checkout, and its output lines. It starts
    with SIGINT ignored, as a shell starts a background job (`lenserve up &`): the tests that
    stop it with SIGINT check that it stops all the same."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "lenserve.cli", "up", "--model", "fake",
                             *flags], cwd=ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            preexec_fn=partial(signal.signal, signal.SIGINT, signal.SIG_IGN))
    return proc, _lines(proc)

@pytest.mark.slow
def test_up_restarts_a_killed_executor_and_serves_again():
    proc, lines = _start_up("--no-predictor")
    try:
        out = "".join(_wait_for(lines, "ready", 240))
        scheduler = re.search(r"scheduler\s+grpc://(\S+)", out).group(1)
        executor_pid = int(re.search(r"executor\s+\S+\s+\(pid (\d+)\)", out).group(1))
        assert _generate_until_ok(scheduler, 30).outputs[0].finish_reason == "length"
        _openai_chat_and_stream(re.search(r"gateway\s+(http://\S+)", out).group(1))
        os.kill(executor_pid, signal.SIGKILL)
        _wait_for(lines, "executor restarted", 30)
        assert _generate_until_ok(scheduler, 120).outputs[0].finish_reason == "length"
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0
    with pytest.raises(ProcessLookupError):
        os.kill(executor_pid, 0)


def _prediction_sources(url: str) -> dict[str, float]:
    import httpx
    from prometheus_client.parser import text_string_to_metric_families
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return {s.labels["source"]: s.value for f in text_string_to_metric_families(text)
            if f.name == "lenserve_prediction_source" for s in f.samples
            if s.name.endswith("_total")}


class _Load:
    """Completions through the gateway, back to back on a few threads, every answer kept."""

    def __init__(self, url: str, threads: int = 2):
        self.url, self.stop = url, threading.Event()
        self.num_ok, self.failures = 0, []
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(threads)]

    def _run(self) -> None:
        import httpx
        body = {"model": "fake", "prompt": "Tell me about the sea.", "max_tokens": 4}
        with httpx.Client(timeout=30) as client:
            while not self.stop.is_set():
                try:
                    resp = client.post(f"{self.url}/v1/completions", json=body)
                    ok = resp.status_code == 200 and \
                        resp.json()["choices"][0]["finish_reason"] == "length"
                except Exception as exc:  # noqa: BLE001 - any failure is what is counted
                    ok, resp = False, exc
                if ok:
                    self.num_ok += 1
                else:
                    self.failures.append(getattr(resp, "text", repr(resp)))

    def __enter__(self):
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for t in self.threads:
            t.join(timeout=60)


def _until(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"{what} within {timeout_s} s"
        time.sleep(0.5)


@pytest.mark.slow
def test_up_serves_through_a_killed_predictor_and_uses_it_again_after_restart():
    """Under a steady stream of requests, kill -9 of the predictor fails none of them (they get
    default predictions), and once ``lenserve up`` has restarted it the scheduler's
    predictions come from it again (retrieval from what it learnt since the restart: its
    in-memory DB starts empty)."""
    proc, lines = _start_up()
    try:
        out = "".join(_wait_for(lines, "ready", 240))
        url = re.search(r"gateway\s+(http://\S+)", out).group(1)
        predictor_pid = int(re.search(r"predictor\s+\S+\s+\(pid (\d+)\)", out).group(1))
        with _Load(url) as load:
            _until(lambda: _prediction_sources(url).get("retrieval", 0) > 0, 60,
                   "the predictor answered from what it learnt")
            before = load.num_ok
            os.kill(predictor_pid, signal.SIGKILL)
            _wait_for(lines, "predictor restarted", 30)
            _wait_for(lines, "predictor serving on", 120)
            during = load.num_ok - before
            time.sleep(2)               # requests predicted by the old process have finished
            retrieved = _prediction_sources(url).get("retrieval", 0)
            _until(lambda: _prediction_sources(url).get("retrieval", 0) > retrieved, 60,
                   "predictions from the restarted predictor")
        sources = _prediction_sources(url)
        print(f"\n{load.num_ok} requests served, {during} of them while the predictor was "
              f"down, {len(load.failures)} failed; predictions by source: {sources}")
        assert during > 0, "no request was served while the predictor was down"
        assert load.failures == [] and load.num_ok > during
        assert sources.get("default", 0) > 0
    finally:
        proc.terminate()
        assert proc.wait(timeout=60) == 0
    with pytest.raises(ProcessLookupError):
        os.kill(predictor_pid, 0)
