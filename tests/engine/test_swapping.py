"""Swapping through a small host KV tier, end to end on the engine: block accounting on the
device and the host holds after every step, a full host pool makes the policy recompute
instead, and tokens are identical whether or not a request was swapped (the fake executor's
next token is a hash of the context read back from the KV blocks, so a lost or misplaced
block changes the output)."""
import random

import pytest
from engine_helpers import make_engine, run_to_completion

from lenserve_contract.sampling_params import SamplingParams
from services.scheduler.policies import POLICIES
from tests.swap_policies import RandomSwapPolicy

# The fake executor's host block is 64 bytes (block_size 4, int64 ids, K and V): 2 KiB hold
# 32 blocks, too few for every preempted request, so refusals happen too.
SMALL_HOST_GIB = 2048 / 2**30


def workload(seed: int, n: int = 20):
    rng = random.Random(seed)
    for i in range(n):
        prompt = [rng.randrange(32, 127) for _ in range(rng.randint(1, 24))]
        out_len = rng.randint(1, 30)
        yield f"r{i}", prompt, SamplingParams(max_tokens=out_len, ignore_eos=True), out_len


def run(policy: str, seed: int, **config):
    engine = make_engine(policy, num_gpu_blocks=20, max_model_len=64, max_num_batched_tokens=24,
                         max_num_seqs=6, **config)
    done = {}
    for step, (rid, prompt, params, n) in enumerate(workload(seed)):
        engine.add_request(rid, prompt_token_ids=prompt, sampling_params=params,
                           predicted_output_len=n)
        if step % 2 == 0:
            done.update((o.request_id, o) for o in engine.step() if o.finished)
    done.update(run_to_completion(engine))
    return {rid: out.outputs[0].token_ids for rid, out in done.items()}, engine


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_swaps_keep_tokens_and_accounting(monkeypatch, seed):
    monkeypatch.setitem(POLICIES, RandomSwapPolicy.name, RandomSwapPolicy)
    reference, _ = run("vllm", seed)
    tokens, engine = run(RandomSwapPolicy.name, seed, swap_space_gib=SMALL_HOST_GIB)
    assert tokens == reference
    kv = engine.kv_manager.stats()
    assert kv.bytes_swapped_in > 0 and kv.num_swapped_requests == 0
    assert kv.num_free_host_blocks == kv.num_host_blocks == engine.stats().num_host_blocks


@pytest.mark.parametrize("policy", ["alise", "fastserve", "fluidinfer"])
@pytest.mark.parametrize("seed", [0, 1])
def test_swapping_policies_on_a_small_host_tier_give_vllms_tokens(policy, seed):
    reference, _ = run("vllm", seed)
    tokens, engine = run(policy, seed, swap_space_gib=SMALL_HOST_GIB)
    assert tokens == reference
    assert engine.kv_manager.stats().num_swapped_requests == 0


def test_a_full_host_tier_falls_back_to_recompute(monkeypatch):
    monkeypatch.setitem(POLICIES, RandomSwapPolicy.name, RandomSwapPolicy)
    reference, _ = run("vllm", 3)
    tiny = 3 * 64 / 2**30                      # three host blocks
    tokens, engine = run(RandomSwapPolicy.name, 3, swap_space_gib=tiny)
    assert tokens == reference
    assert engine.scheduler.state.swap_refusals > 0
