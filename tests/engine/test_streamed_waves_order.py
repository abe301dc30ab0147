"""The CUDA branch of staged streaming (side-stream uploads ordered by events) run on the CPU
under a model of CUDA streams, so that its ordering is checked without a GPU.

``torch.cuda``'s streams and events are replaced by a vector-clock model: every access to a
staging buffer (an upload's copy on the side stream; the new K/V written and the attention
read on the compute stream) is stamped with its stream's clock, ``record``/``wait_event`` carry
clocks between streams, and each access must happen after every conflicting access issued
before it on the other stream (the last write; for a write, also the reads since). The CPU
runs every copy at once, so tokens say nothing about ordering: the clocks do. Two deliberately
broken variants show that the check catches a missing wait either way.
"""
from __future__ import annotations

import contextlib

import pytest
import torch
from test_streamed_waves import BLOCK, HOST_GIB, make, run, workload

from services.executor import streaming
from services.executor.runner import InProcessExecutor


class _Stream:
    def __init__(self, model: _Streams, name: str):
        self.model, self.name, self.clock = model, name, {}

    def wait_event(self, event: _Event) -> None:
        for stream, tick in event.clock.items():
            self.clock[stream] = max(self.clock.get(stream, 0), tick)


class _Event:
    def __init__(self, model: _Streams):
        self.model, self.clock = model, None

    def record(self, stream: _Stream | None = None) -> None:
        self.clock = dict((stream or self.model.current).clock)


class _Streams:
    """Streams, events and the happens-before check of staging-buffer accesses."""

    def __init__(self):
        self.compute = self.current = _Stream(self, "compute")
        self.staging: streaming._Staging | None = None
        self.state: dict[int, tuple[tuple | None, list]] = {0: (None, []), 1: (None, [])}
        self.races: list[str] = []
        self.accesses = {"side": 0, "compute": 0}

    @contextlib.contextmanager
    def use(self, stream: _Stream):
        before, self.current = self.current, stream
        try:
            yield
        finally:
            self.current = before

    def buffer_of(self, t: torch.Tensor) -> int | None:
        st = self.staging
        if st is None or not isinstance(t, torch.Tensor):
            return None
        for buf in (0, 1):
            for whole in (st.k, st.v):
                lo = whole[buf].data_ptr()
                if lo <= t.data_ptr() < lo + whole[buf].numel() * whole.element_size():
                    return buf
        return None

    def access(self, buf: int, kind: str) -> None:
        s = self.current
        s.clock[s.name] = s.clock.get(s.name, 0) + 1
        now = (s.name, dict(s.clock))
        self.accesses["side" if s is not self.compute else "compute"] += 1
        last_write, reads = self.state[buf]
        earlier = ([last_write] if last_write else []) + (reads if kind == "write" else [])
        for name, clock in earlier:
            if now[1].get(name, 0) < clock[name]:
                self.races.append(f"{kind} of buffer {buf} on {s.name} is not ordered after "
                                  f"an earlier access on {name}")
        self.state[buf] = (now, []) if kind == "write" else (last_write, reads + [now])


@pytest.fixture(scope="module")
def loaded():
    return InProcessExecutor("llama-tiny", block_size=BLOCK, num_gpu_blocks=8).loaded


@pytest.fixture
def streams(monkeypatch):
    """The model in place of ``torch.cuda`` (for the streaming module), accesses logged."""
    model = _Streams()
    monkeypatch.setattr(torch.cuda, "Stream", lambda *a, **k: _Stream(model, "side"))
    monkeypatch.setattr(torch.cuda, "Event", lambda *a, **k: _Event(model))
    monkeypatch.setattr(torch.cuda, "current_stream", lambda *a: model.current)
    monkeypatch.setattr(torch.cuda, "stream", model.use)
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self, *a, **k: self)
    real_copy, real_write = torch.Tensor.copy_, streaming._write

    def copy_(self, src, non_blocking=False):
        buf = model.buffer_of(self)
        if buf is not None:
            model.access(buf, "write")
        return real_copy(self, src, non_blocking)

    def write(k_cache, v_cache, k, v, slots):
        buf = model.buffer_of(k_cache)
        if buf is not None:
            model.access(buf, "write")
        real_write(k_cache, v_cache, k, v, slots)
    monkeypatch.setattr(torch.Tensor, "copy_", copy_)
    monkeypatch.setattr(streaming, "_write", write)
    return model


def _streamed_engine(loaded, model: _Streams):
    """The forced staged path with its CUDA branch on: side stream, events, async copies."""
    engine = make(loaded, "fluidinfer", 20, HOST_GIB, staged=True, staging_blocks=24,
                  policy_config=["stream_kv_blocks=24"])
    ex = engine.executor
    staging = ex._staging
    staging.cuda, staging.stream = True, torch.cuda.Stream()
    model.staging = staging
    forward = ex.backend.forward

    def read(q, k_cache, v_cache, meta, scale, **opts):
        buf = model.buffer_of(k_cache)
        if buf is not None:
            model.access(buf, "read")
        return forward(q, k_cache, v_cache, meta, scale, **opts)
    ex.backend = type("Logged", (), {"forward": staticmethod(read)})()
    return engine


def test_the_cuda_branch_orders_every_staging_access(loaded, streams):
    reqs = workload(1, 14)
    reference, _ = run(make(loaded, "vllm", 256), reqs, arrive_every=2)
    seen = []
    tokens, _ = run(_streamed_engine(loaded, streams), reqs, arrive_every=2, record=seen)
    assert tokens == reference
    assert max(len(o.waves or []) for o in seen) >= 2 and any(o.streamed for o in seen)
    assert streams.accesses["side"] > 0 and streams.accesses["compute"] > 0
    assert not streams.races, streams.races[:5]


class _Forgetful(dict):
    def __setitem__(self, key, value) -> None:     # the upload's event is lost
        pass


@pytest.mark.parametrize("broken", ["no_wait_for_compute", "no_wait_for_upload"])
def test_the_check_catches_a_missing_wait(loaded, streams, monkeypatch, broken):
    engine = _streamed_engine(loaded, streams)
    if broken == "no_wait_for_compute":
        monkeypatch.setattr(streaming._Staging, "computed", lambda self, i: None)
    else:
        engine.executor._staging.uploaded = _Forgetful()
    run(engine, workload(1, 14), arrive_every=2)
    assert streams.races
