"""``lenserve up`` for real: its services started, killed and restarted under load, and
stopped by every signal a terminal sends."""
from __future__ import annotations

import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from functools import partial
from pathlib import Path

import pytest

from lenserve_contract.sampling_params import SamplingParams

ROOT = Path(__file__).resolve().parent.parent


PARENT = """
import subprocess, sys, time
from lenserve.entrypoints.supervisor import ServiceSpec, partial_spawn
spec = ServiceSpec("sleeper", (sys.executable, "-c", "import time; time.sleep(600)"), "")
print(partial_spawn(subprocess.Popen)(spec).pid, flush=True)
time.sleep(600)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal")
def test_a_child_dies_when_its_supervisor_is_killed():
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True,
                              cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    child = int(parent.stdout.readline())
    parent.kill()
    parent.wait()
    _until(lambda: not _alive(child), 10, "the child gone after its parent's SIGKILL")


def _alive(pid: int) -> bool:
    """Running (a zombie, dead but not yet reaped by init, counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


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
    """``lenserve up --model fake FLAGS`` from this checkout, on free ports, and its output
    lines. It starts with SIGINT ignored, as a shell starts a background job (`lenserve up &`):
    the tests that stop it with SIGINT check that it stops all the same."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "lenserve.cli", "up", "--model", "fake",
                             "--port", "0", "--scheduler-port", "0", *flags],
                            cwd=ROOT, env=env, text=True,
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
    predictions come from it again (retrieval: its in-memory DB starts from the bundled seed
    and what it learns since the restart)."""
    proc, lines = _start_up()
    try:
        out = "".join(_wait_for(lines, "ready", 240))
        url = re.search(r"gateway\s+(http://\S+)", out).group(1)
        predictor_pid = int(re.search(r"predictor\s+\S+\s+\(pid (\d+)\)", out).group(1))
        with _Load(url) as load:
            _until(lambda: _prediction_sources(url).get("retrieval", 0) > 0, 60,
                   "the predictor answered from its DB")
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


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal")
def test_every_service_stops_when_up_is_killed():
    """SIGKILL leaves ``up`` no chance to stop its services: each must stop by itself (the
    parent-death signal), and the gateway must no longer answer."""
    proc, lines = _start_up()
    try:
        out = "".join(_wait_for(lines, "ready", 240))
        pids = [int(p) for p in re.findall(r"\(pid (\d+)", out)]
        url = re.search(r"gateway\s+(http://\S+)", out).group(1)
        assert len(pids) == 4 and all(_alive(pid) for pid in pids), out
        assert _http_answers(url)
    finally:
        proc.kill()
        proc.wait(timeout=30)
    _until(lambda: not any(_alive(pid) for pid in pids), 30, "every service gone")
    assert not _http_answers(url)


def _http_answers(url: str) -> bool:
    import httpx
    try:
        return httpx.get(f"{url}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.mark.slow
def test_sighup_stops_up_and_its_services_as_ctrl_c_does():
    """The terminal that ran ``up`` went away: everything stops, cleanly."""
    proc, lines = _start_up("--no-predictor")
    try:
        out = "".join(_wait_for(lines, "ready", 240))
        pids = [int(p) for p in re.findall(r"\(pid (\d+)", out)]
    finally:
        proc.send_signal(signal.SIGHUP)
        assert proc.wait(timeout=60) == 0
    _wait_for(lines, "stopping", 5)
    assert not any(_alive(pid) for pid in pids)


def test_a_port_whose_last_server_just_stopped_is_not_taken():
    """Connections the last server closed first sit in TIME_WAIT on its port; the servers
    bind through that (SO_REUSEADDR), so up's check must too, or a restart right after a
    stop is refused."""
    from lenserve.commands.up import PortTaken, claim_port

    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)   # as uvicorn's and gRPC's
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    conn, _ = server.accept()
    conn.close()          # the server side closes first: its end goes to TIME_WAIT
    server.close()
    client.close()
    assert claim_port("127.0.0.1", port, "gateway", "--port") == port
    with socket.socket() as holder:     # a server listening there now: taken
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        holder.bind(("127.0.0.1", port))
        holder.listen()
        with pytest.raises(PortTaken):
            claim_port("127.0.0.1", port, "gateway", "--port")


@pytest.mark.slow
def test_up_with_replicas_serves_through_a_killed_replica_and_uses_it_again():
    proc, lines = _start_up("--no-predictor", "--replicas", "2")
    try:
        out = "".join(_wait_for(lines, "ready", 240))
        url = re.search(r"gateway\s+(http://\S+)", out).group(1)
        pid = int(re.search(r"scheduler-0\s+\S+\s+\(pid (\d+)\)", out).group(1))
        with _Load(url) as load:
            _until(lambda: load.num_ok >= 10, 60, "requests served")
            os.kill(pid, signal.SIGKILL)
            _wait_for(lines, "scheduler-0 restarted", 30)
            served = load.num_ok
            _until(lambda: load.num_ok >= served + 20, 120, "requests served after the kill")
        # Only requests running on the killed replica may fail (two threads: two at most);
        # the gateway reports them as a failed generation, not as a hang.
        assert len(load.failures) <= 2, load.failures[:3]
        assert all("generation_failed" in f for f in load.failures), load.failures[:3]
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0
