"""``lenserve up``: the restart rules on fake processes, and the real thing end to end."""
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

from lenserve.entrypoints.supervisor import ServiceSpec, Supervisor
from lenserve_contract.sampling_params import SamplingParams

ROOT = Path(__file__).resolve().parent.parent


class FakeProc:
    count = 0

    def __init__(self, argv, **options):
        FakeProc.count += 1
        self.pid, self.returncode, self.options = FakeProc.count, None, options

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
        args = build_parser().parse_args(["up", "--model", "fake", "--no-predictor",
                                          "--port", "0", "--scheduler-port", "0", *flags])
        return {s.name: s for s in build_specs(args)}, [s.name for s in build_specs(args)]

    by_name, order = specs()
    assert "kvmanager" not in by_name and "--kvmanager" not in by_name["scheduler"].argv
    by_name, order = specs("--swap-space", "0.5", "--kv-int8")
    assert order.index("executor") < order.index("kvmanager") < order.index("scheduler")
    kv = by_name["kvmanager"].argv
    assert kv[kv.index("--executor") + 1] == by_name["executor"].url and "--int8" in kv
    sched = by_name["scheduler"].argv
    assert sched[sched.index("--kvmanager") + 1] == by_name["kvmanager"].url


def _specs(monkeypatch, *flags, environ=None) -> dict[str, ServiceSpec]:
    """``up``'s services for FLAGS, the published ports taken as given (not claimed)."""
    from lenserve.cli import build_parser
    from lenserve.commands import up

    for key in ("LENSERVE_POLICY", "LENSERVE_API_KEY"):
        monkeypatch.delenv(key, raising=False)
    for key, value in (environ or {}).items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(up, "claim_port", lambda host, port, what, flag: port)
    args = build_parser().parse_args(["up", "--model", "fake", *flags])
    return {s.name: s for s in up.build_specs(args)}


def _flag(argv, name: str) -> str:
    return argv[argv.index(name) + 1]


def test_defaults_serve_alise_from_a_seeded_predictor_on_the_documented_ports(monkeypatch):
    specs = _specs(monkeypatch)
    sched, predictor = specs["scheduler"].argv, specs["predictor"].argv
    assert _flag(sched, "--policy") == "alise" and _flag(predictor, "--seed-data") == "bundled"
    assert _flag(sched, "--predictor") == specs["predictor"].url
    assert specs["scheduler"].url == "grpc://127.0.0.1:50051"
    assert specs["gateway"].url == "http://127.0.0.1:8000"
    assert dict(specs["gateway"].env) == {"LENSERVE_API_KEY": ""}


def test_policy_ports_seed_and_key_can_be_chosen(monkeypatch):
    specs = _specs(monkeypatch, "--port", "9100", "--scheduler-port", "9101", "--api-key", "k1",
                   "--predictor-seed", "none", environ={"LENSERVE_API_KEY": "k2"})
    assert specs["gateway"].url.endswith(":9100") and specs["scheduler"].url.endswith(":9101")
    assert dict(specs["gateway"].env) == {"LENSERVE_API_KEY": "k1,k2"}
    assert "k1" not in " ".join(specs["gateway"].argv)     # keys stay out of `ps`
    assert _flag(specs["predictor"].argv, "--seed-data") == "none"
    specs = _specs(monkeypatch, environ={"LENSERVE_POLICY": "vllm"})
    assert _flag(specs["scheduler"].argv, "--policy") == "vllm"


def test_replicas_put_a_router_on_the_scheduler_port_in_front_of_n_replicas(monkeypatch):
    specs = _specs(monkeypatch, "--replicas", "3", "--router-policy", "least-loaded")
    schedulers = [specs[f"scheduler-{i}"] for i in range(3)]
    assert all(f"executor-{i}" in specs for i in range(3)) and "scheduler" not in specs
    for i, sched in enumerate(schedulers):       # each replica drives its own executor
        assert _flag(sched.argv, "--executor") == specs[f"executor-{i}"].url
    router = specs["router"]
    assert router.url == "grpc://127.0.0.1:50051"        # what the SDK and the gateway dial
    assert _flag(router.argv, "--replicas").split(",") == \
        [s.url.removeprefix("grpc://") for s in schedulers]
    assert _flag(router.argv, "--policy") == "least-loaded"
    assert _flag(router.argv, "--predictor") == specs["predictor"].url
    assert _flag(specs["gateway"].argv, "--scheduler") == router.url


def test_a_taken_port_stops_up_before_any_service_starts(capsys):
    from lenserve.cli import main
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        for flag in ("--port", "--scheduler-port"):
            other = "--scheduler-port" if flag == "--port" else "--port"
            assert main(["up", "--model", "fake", flag, str(port), other, "0"]) == 2
            err = capsys.readouterr().err
            assert f"127.0.0.1:{port} is taken" in err and flag in err, err


def test_children_are_spawned_with_their_env_and_to_die_with_the_supervisor():
    sup = Supervisor([ServiceSpec("gateway", ("x",), "http://h:1", env=(("K", "v"),))],
                     spawn=FakeProc, report=lambda _: None)
    sup.start_all()
    options = sup.running["gateway"].proc.options
    assert options["env"]["K"] == "v" and options["env"]["PATH"] == os.environ["PATH"]
    assert callable(options["preexec_fn"]) == sys.platform.startswith("linux")


def test_the_predictor_service_seeds_a_model_it_does_not_hold_once(tmp_path):
    """``up``'s predictor (``predictor serve --seed-data bundled``) starts from the bundled seed,
    and a DB that already holds the model (one that outlived a restart) is not seeded again."""
    import argparse

    from services.predictor.__main__ import seed_if_empty
    from services.predictor.config import PredictorConfig
    from services.predictor.core import Predictor
    from services.predictor.local import load_seed

    core = Predictor(PredictorConfig(default_model="m"))
    try:
        seed = argparse.Namespace(model="m", seed_data="bundled")
        # the seed's repeated prompts are one point each
        assert seed_if_empty(core, seed) and core.store.count("m") > len(load_seed()[0]) // 2
        seeded = core.store.count("m")
        assert seed_if_empty(core, seed) and core.store.count("m") == seeded
        assert core.predict(["Write a poem about the sea."], "m")[0].source.value != "default"
        missing = argparse.Namespace(model="other", seed_data=str(tmp_path / "absent.jsonl"))
        assert not seed_if_empty(core, missing) and "other" not in core.store.models()
    finally:
        core.close()


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
