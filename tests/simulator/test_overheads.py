"""The simulator charges the scheduler's CPU time, the predictor's latency and the INT8 codec
and link bytes: each changes virtual time the way it should."""
from __future__ import annotations

import json

import pytest

from services.kvmanager.config import KVManagerConfig
from services.scheduler.request import Prediction
from services.simulator import overheads
from services.simulator.executor import SimExecutor, VirtualClock
from services.simulator.features import from_groups
from services.simulator.host_tier import SimKVManager
from services.simulator.target import from_roofline, with_overheads


class _Pump:
    def __init__(self):
        self.queued = []

    def submit(self, rid, query):
        self.queued.append(rid)

    def drain(self):
        out, self.queued = [(r, Prediction(10, 10, "test")) for r in self.queued], []
        return out


def test_a_prediction_lands_after_the_latency_and_a_busy_predictor_batches_the_queue():
    clock = VirtualClock()
    pump = overheads.DelayedPredictions(_Pump(), clock, latency_s=0.1)
    pump.submit("a", None)
    clock.advance(0.05)
    pump.submit("b", None)          # predictor busy with a: b and c go in the next batch
    pump.submit("c", None)
    assert pump.drain() == []
    clock.advance_to(0.1)
    assert [r for r, _ in pump.drain()] == ["a"]
    clock.advance_to(0.19)
    assert pump.drain() == []
    clock.advance_to(0.2)
    assert sorted(r for r, _ in pump.drain()) == ["b", "c"]


def test_the_scheduler_cpu_time_is_added_to_each_iteration():
    target = from_roofline("v100-32g", "opt-13b")
    f = from_groups([(8, 1, 100)])
    free, charged = VirtualClock(), VirtualClock()
    SimExecutor(target.shape, target.cost, free, num_gpu_blocks=64)._run(0, f, [], 8)
    sched = overheads.SchedulerOverhead(0.001, 0.0005)
    ex = SimExecutor(target.shape, target.cost, charged, num_gpu_blocks=64, scheduler=sched)
    ex._run(0, f, [], 8)
    assert charged.now - free.now == pytest.approx(0.001 + 8 * 0.0005)
    assert ex.scheduler_s == pytest.approx(0.005)


@pytest.mark.parametrize("int8", [False, True])
def test_int8_puts_the_packed_bytes_on_the_link_and_charges_the_codec(int8):
    target, clock = from_roofline("v100-32g", "opt-13b"), VirtualClock()
    info = SimExecutor(target.shape, target.cost, clock, num_gpu_blocks=64).model_info()
    kv = SimKVManager(KVManagerConfig(1, int8=int8), info, target.link, clock)
    kv.swap_out("r", list(range(8))).wait()
    dev = 8 * kv.device_block_bytes
    link = kv.stats().link_bytes_out
    codec = dev / target.link.int8_codec_bytes_per_s if int8 else 0.0
    assert clock.now == pytest.approx(target.link.seconds(link, out=True) + codec)
    assert (dev / link >= 1.9) if int8 else link == dev


def test_the_overheads_file_is_read_and_none_charges_nothing(tmp_path):
    path = tmp_path / "o.json"
    path.write_text(json.dumps({"scheduler": {"alise": {"intercept_s": 1e-4, "per_seq_s": 1e-5}},
                                "predictor_latency_s": {"embedded": 0.004},
                                "int8_codec_bytes_per_s": 1e9,
                                "meta": {"source": "paper 001, Table 2"}}))
    target = with_overheads(from_roofline("v100-32g", "opt-13b"), str(path))
    assert target.overheads.predictor_for("embedded") == 0.004
    assert target.overheads.predictor_for("oracle") == 0.0
    assert target.overheads.scheduler_for("alise").seconds(10) == pytest.approx(2e-4)
    assert any("paper 001, Table 2" in n for n in target.notes)
    assert with_overheads(target, "none").overheads is None
    with pytest.raises(ValueError, match="no overheads file"):
        with_overheads(target, str(tmp_path / "missing.json"))
