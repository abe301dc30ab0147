"""EconoServe, FluidInfer, Sarathi and alise-fluid on whole workloads: every request finishes
with vLLM's tokens, block accounting holds after every step (make_engine checks integrity),
whatever the predictions (missing, right, 100x too small or too large)."""
import random

import pytest
from engine_helpers import make_engine, run_to_completion

from lenserve_contract.sampling_params import SamplingParams
from services.executor.fake import FakeExecutor

POLICIES = ["econoserve", "fluidinfer", "sarathi", "alise-fluid"]


def workload(engine, seed, n=24):
    rng = random.Random(seed)
    for i in range(n):
        max_tokens = rng.randint(1, 40)
        prediction = rng.choice([None, max_tokens, max(max_tokens // 100, 1), 100 * max_tokens])
        prompt = [rng.randint(0, 255) for _ in range(rng.randint(1, 30))]
        engine.add_request(str(i), prompt_token_ids=prompt,
                           sampling_params=SamplingParams(temperature=0, max_tokens=max_tokens),
                           predicted_output_len=prediction)
    return {k: v.outputs[0].token_ids for k, v in run_to_completion(engine).items()}


def tight(policy, **kw):
    return make_engine(policy, num_gpu_blocks=24, max_model_len=80, max_num_batched_tokens=16,
                       eos_period=7, **kw)


def roomy_vllm():
    return make_engine("vllm", num_gpu_blocks=256, max_model_len=80, eos_period=7)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("policy", POLICIES)
def test_random_workload_matches_vllm(policy, seed):
    reference = workload(roomy_vllm(), seed)
    got = workload(tight(policy), seed)
    assert got == reference and len(got) == 24


class WaveRecorder(FakeExecutor):
    def __init__(self, **kw):
        super().__init__(**kw)
        self.waves = []

    def execute(self, batch):
        if batch.waves:
            self.waves.append(batch.waves)
        return super().execute(batch)


def test_fluidinfer_waves_keep_tokens_identical():
    executor = WaveRecorder(num_gpu_blocks=24, block_size=4, max_model_len=80, eos_period=7)
    got = workload(tight("fluidinfer", executor=executor, policy_config=("wave_kv_blocks=6",)), 0)
    reference = workload(roomy_vllm(), 0)
    assert executor.waves and got == reference


def test_econoserve_under_prediction_recomputes_and_never_swaps():
    engine = tight("econoserve", policy_config=("padding_ratio=0", "enable_pipelining=false"))
    rng = random.Random(5)
    for i in range(12):
        engine.add_request(str(i), prompt_token_ids=[rng.randint(0, 255) for _ in range(8)],
                           sampling_params=SamplingParams(temperature=0, max_tokens=40,
                                                          ignore_eos=True),
                           predicted_output_len=1)
    got = {k: v.outputs[0].token_ids for k, v in run_to_completion(engine).items()}
    stats = engine.stats()
    assert stats.num_preemptions > 0 and stats.num_swapped == 0
    assert all(len(t) == 40 for t in got.values()) and len(got) == 12
