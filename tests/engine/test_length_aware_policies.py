"""Every length-aware policy on the engine with the fake executor: a randomised workload
finishes, keeps block accounting intact every step, and yields vLLM's tokens."""
import random

import pytest
from engine_helpers import make_engine, run_to_completion

from lenserve_contract.sampling_params import SamplingParams
from services.scheduler.policies import make_policy
from services.scheduler.config import SchedulerConfig

POLICIES = ["alise", "oracle", "ssjf", "ltr", "fastserve"]


def _workload(seed: int, n: int = 24):
    rng = random.Random(seed)
    for i in range(n):
        prompt = [rng.randrange(32, 127) for _ in range(rng.randint(1, 30))]
        true_len = rng.randint(1, 40)
        # Predictions missing, right, or wrong by 100x either way.
        predicted = rng.choice([None, true_len, max(1, true_len // 100), true_len * 100])
        yield f"r{i}", prompt, SamplingParams(max_tokens=true_len, ignore_eos=True), predicted


def _run(policy: str, seed: int, **config):
    engine = make_engine(policy, num_gpu_blocks=24, max_model_len=80, max_num_batched_tokens=24,
                         max_num_seqs=6,
                         **config)
    done = {}
    for step, (rid, prompt, params, predicted) in enumerate(_workload(seed)):
        engine.add_request(rid, prompt_token_ids=prompt, sampling_params=params,
                           predicted_output_len=predicted)
        if step % 3 == 0:               # arrivals interleave with iterations
            done.update((o.request_id, o) for o in engine.step() if o.finished)
    done.update(run_to_completion(engine))
    return {rid: out.outputs[0].token_ids for rid, out in done.items()}, engine


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("seed", [0, 1])
def test_random_workload_finishes_with_vllms_tokens(policy, seed):
    reference, _ = _run("vllm", seed)
    tokens, engine = _run(policy, seed)
    assert tokens == reference
    assert len(tokens) == 24 and engine.stats().num_preemptions >= 0


@pytest.mark.parametrize("policy", POLICIES)
def test_bad_config_that_cannot_fit_the_pool_is_refused(policy):
    cfg = SchedulerConfig(num_gpu_blocks=8, block_size=4, max_model_len=32)
    with pytest.raises(ValueError, match="watermark_blocks"):
        make_policy(policy, cfg, ["watermark_blocks=1"])
    make_policy(policy, cfg)            # the defaults fit
