"""The policy's ``stream_mode`` reaches the executor: the simulator charges that mode's work and
bounds the streamed KV by its rate; a GPU executor, which has no CPU attention over the host
tier, turns streaming off with the reason."""
from types import SimpleNamespace

import pytest
from sched_helpers import make_scheduler

from services.scheduler.streams import setup_streaming


class KV:
    stream_link_bytes_per_s, device_block_bytes = 25e9, 1 << 20

    def stream_source(self):
        return object()


class SimLike:
    def __init__(self):
        self.mode = None

    def attach_stream_source(self, source):
        pass

    def set_stream_mode(self, mode):
        self.mode = mode

    def stream_bytes_per_s(self):
        return 100e9 if self.mode == "cpu" else 25e9


@pytest.mark.parametrize("mode, blocks_per_s", [("link", 25e9 / (1 << 20)),
                                                ("cpu", 100e9 / (1 << 20))])
def test_the_mode_reaches_the_simulator_and_sets_the_streamed_rate(mode, blocks_per_s):
    s = make_scheduler("fluidinfer", num_host_blocks=32, policy_config=(f"stream_mode={mode}",))
    ex = SimLike()
    setup_streaming(s.state, ex, KV(), s.policy.options.stream_mode)
    assert ex.mode == mode and s.state.can_stream
    assert s.state.stream_blocks_per_s == pytest.approx(blocks_per_s)


def test_cpu_attention_beside_a_gpu_executor_is_refused_with_the_reason():
    s = make_scheduler("fluidinfer", num_host_blocks=32, policy_config=("stream_mode=cpu",))
    gpu = SimpleNamespace(attach_stream_source=lambda source: None, stream_staged=True)
    setup_streaming(s.state, gpu, KV(), "cpu")
    assert not s.state.can_stream and "not built" in s.state.stream_off_reason


def test_an_unknown_mode_is_refused():
    with pytest.raises(ValueError, match="stream_mode"):
        make_scheduler("fluidinfer", policy_config=("stream_mode=pcie",))
