"""``n > 1`` on the engine: the prompt is prefilled once and its full blocks are shared by the
n samples; each sample is what a lone request with its (derived) seed would give. The fake
executor's next token is a hash of the context read back from the KV blocks, so a sample fed
a wrong or freed shared block changes its tokens."""
import random

import pytest
from engine_helpers import CountingExecutor, make_engine, run_to_completion

from lenserve_contract.errors import InvalidRequestError
from lenserve_contract.sampling_params import SamplingParams
from services.executor.fake import FakeExecutor
from services.scheduler.parallel import child_params
from services.scheduler.policies import POLICIES
from tests.swap_policies import RandomSwapPolicy

PROMPT = list(range(40, 63))        # 23 tokens: 5 full blocks of 4 shared, 3 recomputed


def choices(out):
    assert [c.index for c in out.outputs] == list(range(len(out.outputs)))
    return [c.token_ids for c in out.outputs]


def one(params, prompt=PROMPT, **engine):
    e = make_engine(**engine)
    e.add_request("r", prompt_token_ids=prompt, sampling_params=params)
    return run_to_completion(e)["r"]


def test_greedy_samples_all_equal_the_single_sample():
    single = one(SamplingParams(max_tokens=6, temperature=0, ignore_eos=True))
    out = one(SamplingParams(max_tokens=6, temperature=0, ignore_eos=True, n=4))
    assert choices(out) == choices(single) * 4
    assert all(c.finish_reason == "length" for c in out.outputs) and out.finished


def test_seeded_samples_differ_and_are_reproducible():
    params = SamplingParams(max_tokens=6, seed=11, ignore_eos=True, n=3)
    a, b = choices(one(params)), choices(one(params))
    assert a == b
    assert len({tuple(t) for t in a}) == 3
    # The first sample keeps the request's seed: it is what n = 1 gives.
    assert a[0] == choices(one(SamplingParams(max_tokens=6, seed=11, ignore_eos=True)))[0]


@pytest.mark.parametrize("caching", [True, False])
def test_the_prompt_is_prefilled_once(caching):
    n, out_len = 4, 5
    executor = CountingExecutor(FakeExecutor(num_gpu_blocks=64, block_size=4, max_model_len=128))
    out = one(SamplingParams(max_tokens=out_len, seed=1, ignore_eos=True, n=n),
              executor=executor, enable_prefix_caching=caching)
    decode = n * (out_len - 1)
    shared = 20 if caching else 0
    assert executor.fed - decode == len(PROMPT) + (n - 1) * (len(PROMPT) - shared)
    assert out.metrics.num_cached_tokens == 0 and len(out.outputs) == n


def test_children_are_held_until_the_leader_computed_the_shared_blocks():
    # 8-token prefill chunks: the leader needs three iterations for the 23-token prompt.
    e = make_engine(max_num_batched_tokens=8)
    e.add_request("r", prompt_token_ids=PROMPT,
                  sampling_params=SamplingParams(max_tokens=3, ignore_eos=True, n=3))
    assert e.get_num_unfinished_requests() == 3
    assert list(e.scheduler.state.requests) == ["r#n0"]
    e.step()
    e.step()
    assert list(e.scheduler.state.requests) == ["r#n0"]     # 16 of 20 shared tokens done
    e.step()
    assert len(e.scheduler.state.requests) == 3
    assert all(r.num_cached_tokens == 20 for r in e.scheduler.state.requests.values()
               if r.request_id != "r#n0")
    assert len(run_to_completion(e)["r"].outputs) == 3


@pytest.mark.parametrize("steps", [0, 2, 7])
def test_abort_ends_every_sample_and_leaves_no_reference(steps):
    e = make_engine(max_num_batched_tokens=8)
    e.add_request("r", prompt_token_ids=PROMPT,
                  sampling_params=SamplingParams(max_tokens=20, ignore_eos=True, n=3))
    e.add_request("other", prompt_token_ids=PROMPT[:10],
                  sampling_params=SamplingParams(max_tokens=12, ignore_eos=True))
    for _ in range(steps):
        e.step()
    out = e.abort_request("r")
    assert out.finished and [c.finish_reason for c in out.outputs] == ["abort"] * 3
    assert e.abort_request("r") is None
    e.scheduler.check_integrity()
    assert run_to_completion(e)["other"].finished
    bm = e.scheduler.block_manager
    assert not bm.owners() and bm.num_free_blocks == bm.num_blocks
    assert not e.groups.by_parent and not e.has_unfinished_requests()


def test_bad_n_and_taken_ids_are_refused_and_change_nothing():
    e = make_engine()
    for bad in (0, -1, 129, 2.0):
        with pytest.raises(InvalidRequestError) as err:
            e.add_request("x", prompt_token_ids=PROMPT, sampling_params=SamplingParams(n=bad))
        assert err.value.field == "n"
    e.add_request("x", prompt_token_ids=PROMPT, sampling_params=SamplingParams(n=2))
    for rid, n in (("x", 1), ("x", 2), ("x#n1", 1)):
        with pytest.raises(InvalidRequestError, match="already in use"):
            e.add_request(rid, prompt_token_ids=PROMPT, sampling_params=SamplingParams(n=n))
    assert e.get_num_unfinished_requests() == 2
    assert len(run_to_completion(e)["x"].outputs) == 2


def test_non_delta_outputs_carry_every_sample_so_far_and_deltas_only_the_new():
    e = make_engine()
    e.add_request("full", prompt_token_ids=PROMPT,
                  sampling_params=SamplingParams(max_tokens=4, seed=2, ignore_eos=True, n=2))
    e.add_request("delta", prompt_token_ids=PROMPT, delta=True,
                  sampling_params=SamplingParams(max_tokens=4, seed=2, ignore_eos=True, n=2))
    joined: dict[int, list[int]] = {0: [], 1: []}
    last = {}
    while e.has_unfinished_requests():
        for out in e.step():
            last[out.request_id] = out
            if out.request_id == "delta":
                for c in out.outputs:
                    joined[c.index] += c.token_ids
    assert [joined[0], joined[1]] == choices(last["full"])
    assert all(len(t) == 4 for t in choices(last["full"]))


# -- every policy, randomised -------------------------------------------------------------
def workload(seed: int, count: int = 16):
    rng = random.Random(seed)
    system = [rng.randrange(32, 127) for _ in range(12)]
    for i in range(count):
        prompt = (system if rng.random() < 0.5 else []) + [
            rng.randrange(32, 127) for _ in range(rng.randint(2, 18))]
        n = rng.choice([1, 1, 2, 3, 4])
        params = SamplingParams(max_tokens=rng.randint(1, 10), ignore_eos=True, n=n,
                                seed=rng.choice([None, i]),
                                temperature=rng.choice([0.0, 1.0]))
        yield f"r{i}", prompt, params


def run_grouped(policy, seed, **config):
    e = make_engine(policy, num_gpu_blocks=18, max_model_len=64, max_num_batched_tokens=24,
                    max_num_seqs=6, **config)
    done = {}
    for step, (rid, prompt, params) in enumerate(workload(seed)):
        e.add_request(rid, prompt_token_ids=prompt, sampling_params=params,
                      predicted_output_len=params.max_tokens)
        if step % 2 == 0:       # integrity is checked after every step (make_engine)
            done.update((o.request_id, o) for o in e.step() if o.finished)
    done.update(run_to_completion(e))
    bm = e.scheduler.block_manager
    assert not bm.owners() and bm.num_free_blocks == bm.num_blocks
    return {rid: choices(out) for rid, out in done.items()}, e


def reference(seed):
    """Each sample as a lone n = 1 request with its derived seed, on a cache-less engine."""
    e = make_engine(num_gpu_blocks=256, max_model_len=64, enable_prefix_caching=False)
    for rid, prompt, params in workload(seed):
        for i in range(params.n):
            e.add_request(f"{rid}/{i}", prompt_token_ids=prompt,
                          sampling_params=child_params(params, i))
    out = run_to_completion(e)
    return {rid: [out[f"{rid}/{i}"].outputs[0].token_ids for i in range(params.n)]
            for rid, _, params in workload(seed)}


@pytest.mark.parametrize("policy", sorted(p for p in POLICIES if not p.startswith("test-")))
@pytest.mark.parametrize("seed", [0, 1])
def test_every_policy_gives_each_sample_its_lone_tokens(policy, seed):
    got, engine = run_grouped(policy, seed)
    assert got == reference(seed)
    stats = engine.stats()
    assert stats.prefix_cache_hits > 0
    if policy == "vllm":
        assert stats.num_preemptions > 0        # the scenario does preempt


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_swaps_of_samples_sharing_blocks_keep_tokens(monkeypatch, seed):
    monkeypatch.setitem(POLICIES, RandomSwapPolicy.name, RandomSwapPolicy)
    got, engine = run_grouped(RandomSwapPolicy.name, seed, swap_space_gib=2048 / 2**30)
    assert got == reference(seed)
    assert engine.kv_manager.stats().bytes_swapped_in > 0


def test_a_real_tiny_model_samples_n_times_on_one_prefill():
    from lenserve import LLM
    llm = LLM("opt-tiny", num_gpu_blocks=64, block_size=4, max_model_len=128,
              check_integrity=True)
    prompt = "you are a helpful assistant who answers in short sentences. the quick brown fox"
    greedy = dict(max_tokens=6, temperature=0, ignore_eos=True)
    try:
        single = llm.generate([prompt], SamplingParams(**greedy))[0]
        group = llm.generate([prompt], SamplingParams(**greedy, n=3))[0]
        seeded = [llm.generate([prompt], SamplingParams(max_tokens=6, seed=5, ignore_eos=True,
                                                        n=3))[0] for _ in range(2)]
        unseeded = llm.generate([prompt], SamplingParams(max_tokens=6, ignore_eos=True, n=3))[0]
    finally:
        llm.close()
    assert choices(group) == choices(single) * 3
    assert choices(seeded[0]) == choices(seeded[1])
    assert len({tuple(t) for t in choices(seeded[0])}) > 1
    # Without a seed every sample draws its own noise (6 tokens alike by chance: never).
    assert len({tuple(t) for t in choices(unseeded)}) == 3


def test_the_samples_share_one_length_prediction():
    from services.predictor.local import OraclePredictor
    from services.scheduler.predictions import PredictionPump

    class Counting(OraclePredictor):
        asked = 0

        def predict(self, queries, model):
            Counting.asked += len(queries)
            return super().predict(queries, model)
    e = make_engine(max_num_batched_tokens=8)
    e.predictions = PredictionPump(Counting(), "fake")
    e.add_request("r", prompt_token_ids=PROMPT, true_output_len=5,
                  sampling_params=SamplingParams(max_tokens=9, ignore_eos=True, n=3))
    group = e.groups.by_parent["r"]
    out = run_to_completion(e)["r"]
    assert Counting.asked == 1
    assert [c.prediction.length for c in group.children] == [5, 5, 5]
    assert out.metrics.predicted_output_len == 5 and len(out.outputs) == 3
