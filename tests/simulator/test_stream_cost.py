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
    return SimpleNamespace(num_computed_tokens=computed, status=status, request_id=str(computed),
                           token_ids=[0] * (computed + 1))


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


def cpu_executor(host_bps=100e9):
    ex = executor()
    ex.stream_link = HostLink(25e9, 25e9, 0.0, "test", host_attention_bytes_per_s=host_bps)
    ex.set_stream_mode("cpu")
    return ex


def test_the_cpu_mode_attends_on_the_host_and_sends_no_kv_over_the_link():
    shape = model_shape("opt-1.3b")
    per_layer = shape.kv_bytes_per_token() / 24
    big = [(req(20_000), 1)]
    link, cpu = executor(), cpu_executor()
    link.stream_s(big, compute_s=0.01)
    cpu.stream_s(big, compute_s=0.01)
    # The host reads the layer's KV at its attention rate (4x the link here); only the query,
    # the new K/V and the output cross the link.
    act = shape.hidden_size * shape.dtype_bytes
    expect = 20_001 * per_layer / 100e9 + (act + per_layer) / 25e9
    assert cpu.stream_copy_s == pytest.approx(expect * 24)
    assert cpu.stream_stall_s < link.stream_stall_s / 3
    # ... and the device no longer attends over the streamed request: its iteration is
    # shorter than the link mode's by that request's attention.
    cpu.stream_copy_s = link.stream_copy_s = 0.0
    mixed = [(req(2000, RUNNING), 1), (req(20_000), 1)]
    t_cpu = cpu.execute_scheduled(0, mixed).timings
    t_link = link.execute_scheduled(0, mixed).timings
    assert t_cpu.forward_s - t_cpu.swap_s < t_link.forward_s - t_link.swap_s


def test_a_free_link_costs_nothing_and_an_unmodelled_host_refuses_the_cpu_mode():
    ex = executor()
    ex.set_stream_mode("free")
    assert ex.stream_s([(req(20_000), 1)], compute_s=0.001) == 0.0 and ex.stream_copy_s == 0.0
    with pytest.raises(ValueError, match="host CPU's attention throughput"):
        executor().set_stream_mode("cpu")
    with pytest.raises(ValueError, match="stream_mode must be"):
        ex.set_stream_mode("pcie")
