"""One OpenMP team per serving process: the thread that runs the forward passes is the one
that built the model, and every other thread that touches torch keeps its work on itself
(``services.hardware.keep_torch_single_threaded``). A second team makes GNU OpenMP stop
spin-waiting in every team, which slowed each iteration 1.4x on a 2-core CPU; these tests
check the mechanism (which thread does what, how many threads an operation starts), not the
speed."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import pytest

from services.executor.fake import FakeExecutor
from services.executor.servicer import compute_thread
from services.scheduler.async_engine import AsyncEngine
from services.scheduler.engine_core import EngineCore
from services.scheduler.wiring import EngineConfig, engine_parts
from lenserve_contract.sampling_params import SamplingParams
from tests.executor.remote import ServedExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# In a fresh interpreter (so that no OpenMP team exists yet): a thread runs matrix products,
# confined or not, and counts the process's threads before and after while it is alive.
# sentence-transformers brings scikit-learn, which loads a libgomp of its own; where it is
# installed the probe loads it first, so that the confined thread must find torch's runtime
# among two.
_PROBE = """
import json, os, sys, threading, torch
try:
    import sklearn.utils
except ImportError:
    pass
torch.set_num_threads(2)
confine = sys.argv[1] == "confine"
result = {"runtimes": len({line.split()[-1] for line in open("/proc/self/maps")
                           if "libgomp" in line})}
def work():
    if confine:
        from services.hardware import keep_torch_single_threaded
        keep_torch_single_threaded()
    result["threads_here"] = torch.get_num_threads()
    before = len(os.listdir("/proc/self/task"))
    a = torch.randn(1024, 1024)
    for _ in range(3):
        (a @ a).softmax(-1).sum()
    result["started"] = len(os.listdir("/proc/self/task")) - before
t = threading.Thread(target=work)
t.start()
t.join()
result["threads_main"] = torch.get_num_threads()
print(json.dumps(result))
"""


def _probe(mode: str) -> dict:
    out = subprocess.run([sys.executable, "-c", _PROBE, mode], cwd=ROOT, capture_output=True,
                         text=True, timeout=120, env={**os.environ, "OMP_NUM_THREADS": "2"})
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads in /proc")
def test_a_confined_thread_starts_no_openmp_threads_and_leaves_the_others_alone():
    free = _probe("free")
    assert free["started"] >= 1           # the control: a thread's products start a team
    confined = _probe("confine")
    assert confined["started"] == 0 and confined["threads_here"] == 1, confined
    assert confined["threads_main"] == 2  # a per-thread setting: the main thread keeps two


class _Recording(FakeExecutor):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.built_on = threading.get_ident()
        self.ran_on: set[int] = set()

    def execute(self, batch):
        self.ran_on.add(threading.get_ident())
        return super().execute(batch)


def test_the_executor_service_runs_iterations_on_the_thread_that_built_the_executor():
    worker = compute_thread()
    executor = worker.submit(_Recording, num_gpu_blocks=32, block_size=4).result()
    served = ServedExecutor(executor, worker=worker)
    try:
        core = EngineCore(**engine_parts(EngineConfig(model="fake", block_size=4,
                                                      num_gpu_blocks=32), served.client()))
        for i in range(3):
            core.add_request(f"r{i}", prompt=f"prompt {i}",
                             sampling_params=SamplingParams(max_tokens=4))
        while core.has_unfinished_requests():
            core.step()
    finally:
        served.stop()
    assert executor.ran_on == {executor.built_on}
    assert executor.built_on != threading.get_ident()


async def test_async_engine_builds_its_engine_on_the_thread_that_steps_it():
    holder = {}

    def build() -> EngineCore:
        executor = holder["executor"] = _Recording(num_gpu_blocks=32, block_size=4)
        return EngineCore(**engine_parts(EngineConfig(model="fake", block_size=4,
                                                      num_gpu_blocks=32), executor))

    engine = AsyncEngine(build)
    try:
        async for out in engine.generate("hello", SamplingParams(max_tokens=4)):
            pass
        assert out.finished
    finally:
        engine.shutdown()
    executor = holder["executor"]
    assert executor.ran_on == {executor.built_on} == {engine._thread.ident}
    assert executor.built_on != threading.get_ident()


def test_async_engine_raises_what_its_build_raised_and_keeps_no_thread():
    def build():
        raise ValueError("no such model: nope")

    before = threading.active_count()
    with pytest.raises(ValueError, match="no such model"):
        AsyncEngine(build)
    assert threading.active_count() == before
    with pytest.raises(Exception, match="nope"):       # a config that cannot be built, too
        AsyncEngine(EngineConfig(model="nope"))
