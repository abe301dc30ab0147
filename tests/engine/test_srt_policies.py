"""Every length-aware policy on the engine with the fake executor: a randomised workload
finishes, keeps block accounting intact every step, and yields vLLM's tokens."""
import random

import pytest
from engine_helpers import make_engine, run_to_completion

from lenserve_contract.sampling_params import SamplingParams
from services.executor.fake import FakeExecutor
from services.scheduler.config import SchedulerConfig
from services.scheduler.policies import make_policy

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


def _finish_steps(engine) -> dict[str, int]:
    steps = {}
    for i in range(1000):
        if not engine.has_unfinished_requests():
            return steps
        steps.update((o.request_id, i) for o in engine.step() if o.finished)
    raise AssertionError("engine did not drain")


@pytest.mark.parametrize("policy, short_first", [("vllm", False), ("alise", True),
                                                 ("oracle", True), ("fastserve", True)])
def test_a_short_request_behind_long_ones_finishes_first_only_when_preemptive(policy,
                                                                              short_first):
    oracle = policy == "oracle"
    engine = make_engine(policy, max_num_seqs=2, predictor="oracle" if oracle else "none")
    for rid, n in (("long1", 60), ("long2", 60)):
        engine.add_request(rid, prompt_token_ids=[50] * 8, true_output_len=n,
                           predicted_output_len=None if oracle else n,
                           sampling_params=SamplingParams(max_tokens=n, ignore_eos=True))
    if oracle:
        engine.predictions.flush()
    for _ in range(5):
        engine.step()                     # both long requests are running
    engine.add_request("short", prompt_token_ids=[60] * 8, true_output_len=3,
                       predicted_output_len=None if oracle else 3,
                       sampling_params=SamplingParams(max_tokens=3, ignore_eos=True))
    if oracle:
        engine.predictions.flush()
    steps = _finish_steps(engine)
    assert (steps["short"] < min(steps["long1"], steps["long2"])) is short_first
    if oracle:
        assert engine.scheduler.policy.num_demotions == 0


def test_the_policy_fits_the_model_from_measured_iteration_times():
    ex = FakeExecutor(num_gpu_blocks=64, block_size=4, max_model_len=128,
                      cost_per_iteration_s=0.004, cost_per_token_s=0.001)
    engine = make_engine("alise", executor=ex)
    for i in range(12):
        engine.add_request(f"r{i}", prompt_token_ids=[40 + i] * (3 + 5 * i),
                           sampling_params=SamplingParams(max_tokens=4 + 3 * i, ignore_eos=True))
        engine.step()
    while engine.has_unfinished_requests():
        engine.step()
    model = engine.scheduler.policy.model
    assert model.fitted
    t0, alpha, beta, c = model.coefficients
    assert t0 == pytest.approx(0.001, rel=0.05) and beta == pytest.approx(0.001, rel=0.1)
    assert c == pytest.approx(0.004, rel=0.1)
