"""Replicas on separate hosts: network namespaces made here, each replica's scheduler alone in
one behind a veth pair with its own test address (10.45.I.2), the router and the gateway in a
front namespace (10.45.I.1 on each link). One replica is killed under load: the requests that
had not started there finish on the others; only those it was running may fail, with an
error. Needs root and `ip`; skipped otherwise. Bounded: every wait has a limit."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NUM_REPLICAS, MAX_NUM_SEQS, NUM_REQUESTS = 3, 2, 24
pytestmark = pytest.mark.slow


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


@pytest.fixture
def hosts():
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("network namespaces need root and `ip`")
    tag = f"{os.getpid() % 100000}"
    front, replicas = f"lsf{tag}", [f"lsr{i}x{tag}" for i in range(NUM_REPLICAS)]
    made = []
    try:
        for ns in (front, *replicas):
            _ip("netns", "add", ns)
            made.append(ns)
            _ip("-n", ns, "link", "set", "lo", "up")
        for i, ns in enumerate(replicas):
            a, b = f"vr{i}x{tag}", f"vf{i}x{tag}"
            _ip("link", "add", a, "type", "veth", "peer", "name", b)
            _ip("link", "set", a, "netns", ns)
            _ip("link", "set", b, "netns", front)
            _ip("-n", ns, "addr", "add", f"10.45.{i}.2/24", "dev", a)
            _ip("-n", front, "addr", "add", f"10.45.{i}.1/24", "dev", b)
            _ip("-n", ns, "link", "set", a, "up")
            _ip("-n", front, "link", "set", b, "up")
    except subprocess.CalledProcessError as exc:
        for ns in made:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        pytest.skip(f"cannot make network namespaces here: {exc.stderr.decode().strip()}")
    yield front, replicas
    for ns in made:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)


def _spawn(ns: str, *argv: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    return subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, *argv], cwd=ROOT,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)


def test_a_replica_killed_under_load_loses_no_request_that_had_not_started(hosts):
    front, replicas = hosts
    procs = []
    try:
        for i, ns in enumerate(replicas):
            procs.append(_spawn(ns, "-m", "services.scheduler", "--model", "opt-tiny",
                                "--host", f"10.45.{i}.2", "--port", "50051",
                                "--max-num-seqs", str(MAX_NUM_SEQS)))
        targets = ",".join(f"10.45.{i}.2:50051" for i in range(NUM_REPLICAS))
        procs.append(_spawn(front, "-m", "services.router", "--replicas", targets,
                            "--policy", "least-loaded", "--port", "50061", "--hold", "60"))
        procs.append(_spawn(front, "-m", "gateway", "--scheduler", "grpc://127.0.0.1:50061",
                            "--host", "127.0.0.1", "--port", "8000", "--model", "opt-tiny"))
        driver = _spawn(front, "-m", "tests.router.multihost_driver", "127.0.0.1:50061",
                        str(procs[1].pid), "http://127.0.0.1:8000", str(NUM_REQUESTS))
        out, _ = driver.communicate(timeout=600)
        assert driver.returncode == 0, out[-3000:]
        result = json.loads(out.strip().splitlines()[-1])
    finally:
        for p in procs:
            p.kill()
            p.wait(timeout=30)
    ended = result["requests"]
    failed = [r for r in ended if r["finish_reason"] != "length"]
    # A failure is a request the killed replica was running: it had tokens, and says why.
    assert all(r["tokens"] > 0 and "failed after" in (r["error"] or "") for r in failed), failed
    assert len(failed) <= MAX_NUM_SEQS
    assert sum(r["tokens"] == 24 for r in ended) >= NUM_REQUESTS - MAX_NUM_SEQS
    assert result["gateway_status"] == 200
