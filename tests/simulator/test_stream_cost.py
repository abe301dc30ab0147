"""The cost of streamed waves in the simulator: per layer, the streamed requests' KV of that
layer crosses the host link while the layer computes; a copy that outlasts the layer stalls
it, one that fits is hidden; a link that does not overlap compute (a CPU, in place) copies
nothing."""
from types import SimpleNamespace

import pytest

from services.simulator.executor import SimExecutor, VirtualClock
from services.simulator.host_tier import HostLink
from services.simulator.roofline import RooflineCostModel, hardware
from services.simulator.shapes import model_shape

SWAPPED = SimpleNamespace(value="swapped")
RUNNING = SimpleNamespace(value="running")


def executor(overlaps=True):
    shape = model_shape("opt-1.3b")
    ex = SimExecutor(shape, RooflineCostModel(shape, hardware("rtx4090")), VirtualClock(),
                     num_gpu_blocks=64)
    ex.stream_link = HostLink(25e9, 25e9, 0.0, "test", overlaps_compute=overlaps)
    return ex


def req(computed, status=SWAPPED):
    return SimpleNamespace(num_computed_tokens=computed, status=status)


def test_a_copy_shorter_than_the_layer_is_hidden_and_a_longer_one_stalls():
    ex = executor()
    per_layer = model_shape("opt-1.3b").kv_bytes_per_token() / 24
    small = [(req(100), 1)]
    assert ex.stream_s(small, compute_s=0.01) == 0.0
    hidden = ex.stream_hidden_s
    assert hidden == pytest.approx(100 * per_layer / 25e9 * 24)
    big = [(req(20_000), 1)]
    copy_layer = 20_000 * per_layer / 25e9
    assert ex.stream_s(big, compute_s=0.01) == pytest.approx((copy_layer - 0.01 / 24) * 24)
    assert ex.stream_stall_s > 0


def test_resident_requests_and_a_cpu_link_cost_nothing():
    assert executor().stream_s([(req(5000, RUNNING), 1)], compute_s=0.001) == 0.0
    assert executor(overlaps=False).stream_s([(req(50_000), 1)], compute_s=0.001) == 0.0
