"""The CUDA path of streamed waves: each wave's layer uploaded into a device staging buffer on
a side stream (the next wave's upload beside the current wave's compute, ordered by events),
only the new K/V written back to the pinned host pool; tokens identical to ``vllm`` with a
pool that holds everything."""
import pytest
from engine_helpers import TickClock
from test_streamed_waves import BLOCK, HOST_GIB, run, workload

from lenserve.engine.llm_engine import EngineConfig, LLMEngine
from services.executor.runner import InProcessExecutor

pytestmark = pytest.mark.gpu


def make_cuda(policy, num_gpu_blocks, swap_gib=0.0, policy_config=()):
    ex = InProcessExecutor("llama-tiny", block_size=BLOCK, num_gpu_blocks=num_gpu_blocks,
                           max_model_len=64, device="cuda")
    cfg = EngineConfig(model="llama-tiny", policy=policy, check_integrity=True,
                       max_model_len=64, block_size=BLOCK, swap_space_gib=swap_gib,
                       policy_config=tuple(policy_config))
    return LLMEngine(cfg, executor=ex, clock=TickClock())


@pytest.mark.parametrize("stream_blocks", [0, 12])
def test_staged_streaming_on_cuda_gives_vllms_tokens(stream_blocks):
    reqs = workload(0, 16)
    reference, _ = run(make_cuda("vllm", 256), reqs)
    seen = []
    engine = make_cuda("fluidinfer", 16, HOST_GIB, [f"stream_kv_blocks={stream_blocks}"])
    assert engine.executor.stream_staged and engine.scheduler.state.can_stream
    tokens, _ = run(engine, reqs, record=seen)
    assert tokens == reference
    assert any(o.streamed for o in seen) and engine.executor.stream_bytes > 0
