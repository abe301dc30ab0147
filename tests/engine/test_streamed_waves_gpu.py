"""The CUDA path of streamed waves: each wave's layer uploaded into a device staging buffer on
a side stream (the next wave's upload beside the current wave's compute, ordered by events),
only the new K/V written back to the pinned host pool.

Two claims, each compared where it is exact:

* tokens identical to ``vllm`` with a pool that holds everything, in float32 without TF32.
  The two runs batch differently (``vllm`` replays decode graphs of all requests; FluidInfer
  runs eager iterations with other token counts and attention waves of other sizes, whose
  GEMM kernels and Triton tiles differ), so they agree to rounding only. In bfloat16 (the
  ``auto`` dtype on a GPU) a rounding difference of one ulp flips greedy tokens of this
  random-weight model: about one step in thirty has two exactly tied top logits. float32 is
  what ``test_decode_graphs`` compares graphs and eager iterations in, for the same reason.
* in bfloat16, tokens identical to the same schedule with the staging copies serialised on
  the compute stream (no side stream, no events): the same kernels on the same shapes, so any
  difference is an ordering fault of the side stream, not rounding.
"""
import pytest
import torch
from engine_helpers import TickClock
from test_streamed_waves import BLOCK, HOST_GIB, run, workload

from lenserve.engine.llm_engine import EngineConfig, LLMEngine
from services.executor.runner import InProcessExecutor

pytestmark = pytest.mark.gpu


@pytest.fixture
def no_tf32(monkeypatch):
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)


def make_cuda(policy, num_gpu_blocks, swap_gib=0.0, policy_config=(), dtype="float32"):
    ex = InProcessExecutor("llama-tiny", block_size=BLOCK, num_gpu_blocks=num_gpu_blocks,
                           max_model_len=64, device="cuda", dtype=dtype)
    cfg = EngineConfig(model="llama-tiny", policy=policy, check_integrity=True,
                       max_model_len=64, block_size=BLOCK, swap_space_gib=swap_gib,
                       policy_config=tuple(policy_config))
    return LLMEngine(cfg, executor=ex, clock=TickClock())


@pytest.mark.parametrize("stream_blocks", [0, 12])
def test_staged_streaming_on_cuda_gives_vllms_tokens(no_tf32, stream_blocks):
    reqs = workload(0, 16)
    reference, _ = run(make_cuda("vllm", 256), reqs)
    seen = []
    engine = make_cuda("fluidinfer", 16, HOST_GIB, [f"stream_kv_blocks={stream_blocks}"])
    assert engine.executor.stream_staged and engine.scheduler.state.can_stream
    assert engine.executor.kv.cache.dtype == torch.float32
    tokens, _ = run(engine, reqs, record=seen)
    assert tokens == reference
    assert any(o.streamed for o in seen) and engine.executor.stream_bytes > 0


def test_side_stream_uploads_give_the_serialised_copies_tokens_in_bfloat16():
    # Schedules that do not depend on measured seconds: the same batches in both runs.
    config = ["stream_kv_blocks=12", "stream_link_bound=false", "token_budget=256"]
    reqs, runs = workload(0, 16), {}
    for serial in (False, True):
        engine = make_cuda("fluidinfer", 16, HOST_GIB, config, dtype="bfloat16")
        staging = engine.executor._staging
        assert staging.cuda and engine.executor.kv.cache.dtype == torch.bfloat16
        if serial:      # synchronous copies on the compute stream, as on a CPU
            staging.cuda = False
        seen = []
        runs[serial] = run(engine, reqs, record=seen)[0], [len(o.streamed) for o in seen]
        assert sum(runs[serial][1]) > 0
    assert runs[False][1] == runs[True][1]      # the same streamed sets, iteration by iteration
    assert runs[False][0] == runs[True][0]
