"""Automatic prefix caching end to end on the engine. The fake executor's next token is a hash
of the context *read back from the KV blocks*, so a request served a wrong cached block, or a
shared block freed or overwritten under another request, changes the output: tokens must be
identical with caching on and off, for every policy, under preemption and swapping, with the
block accounting (reference counts, the hash index) checked after every step."""
import random

import pytest
from engine_helpers import CountingExecutor, make_engine, replay, run_to_completion

from lenserve import LLM
from lenserve_contract.sampling_params import SamplingParams
from services.scheduler.policies import POLICIES
from tests.swap_policies import RandomSwapPolicy

SMALL_HOST_GIB = 2048 / 2**30      # 32 fake host blocks: some swaps are refused


def shared_prefix_workload(seed: int, n: int = 24):
    """Chat-like prompts: one of three system prompts, then turns that extend an earlier
    request's prompt (multi-turn), or a fresh question."""
    rng = random.Random(seed)
    systems = [[rng.randrange(32, 127) for _ in range(rng.randint(4, 14))] for _ in range(3)]
    earlier: list[list[int]] = []
    for i in range(n):
        if earlier and rng.random() < 0.4:
            base = rng.choice(earlier)
        else:
            base = list(rng.choice(systems))
        prompt = base + [rng.randrange(32, 127) for _ in range(rng.randint(1, 10))]
        prompt = prompt[:40]
        earlier.append(prompt)
        out_len = rng.randint(1, 14)
        yield f"r{i}", prompt, SamplingParams(max_tokens=out_len, ignore_eos=True), out_len


def run(policy: str, seed: int, *, caching: bool, blocks: int = 24, **config):
    engine = make_engine(policy, num_gpu_blocks=blocks, max_model_len=64,
                         max_num_batched_tokens=24, max_num_seqs=6,
                         enable_prefix_caching=caching, **config)
    return replay(engine, shared_prefix_workload(seed)), engine


def _real_policies():
    return sorted(p for p in POLICIES if not p.startswith("test-"))


@pytest.mark.parametrize("policy", _real_policies())
@pytest.mark.parametrize("seed", [0, 1])
def test_every_policy_gives_the_same_tokens_with_caching_on_and_off(policy, seed):
    # 24 blocks of 4 tokens for up to 6 resident requests of up to 54 tokens: preemptions.
    off, engine_off = run(policy, seed, caching=False)
    on, engine = run(policy, seed, caching=True)
    assert on == off and len(on) == 24
    stats = engine.stats()
    assert stats.prefix_cache_hits > 0
    assert engine_off.stats().prefix_cache_hits == 0
    if policy == "vllm":
        assert stats.num_preemptions > 0        # the scenario does preempt


@pytest.mark.parametrize("policy", ["alise", "fastserve", "fluidinfer", "alise-fluid"])
@pytest.mark.parametrize("seed", [0, 1])
def test_swapping_policies_keep_tokens_with_shared_blocks(policy, seed):
    off, _ = run("vllm", seed, caching=False)
    on, engine = run(policy, seed, caching=True, swap_space_gib=SMALL_HOST_GIB)
    assert on == off
    assert engine.kv_manager.stats().num_swapped_requests == 0


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_swaps_of_requests_sharing_blocks_keep_tokens(monkeypatch, seed):
    monkeypatch.setitem(POLICIES, RandomSwapPolicy.name, RandomSwapPolicy)
    off, _ = run("vllm", seed, caching=False)
    on, engine = run(RandomSwapPolicy.name, seed, caching=True, swap_space_gib=SMALL_HOST_GIB)
    assert on == off
    assert engine.kv_manager.stats().bytes_swapped_in > 0


def test_a_shared_system_prompt_is_computed_once_and_counted_as_hits():
    from services.executor.fake import FakeExecutor
    system = list(range(40, 72))                 # 32 tokens: 8 full blocks of 4
    results = {}
    for caching in (False, True):
        executor = CountingExecutor(FakeExecutor(num_gpu_blocks=64, block_size=4,
                                                 max_model_len=128))
        engine = make_engine(executor=executor, num_gpu_blocks=64, max_model_len=128,
                             enable_prefix_caching=caching)
        for i in range(6):
            # One after another: each finds the system prompt's blocks cached (free or held).
            engine.add_request(f"q{i}", prompt_token_ids=system + [80 + i, 81 + i],
                               sampling_params=SamplingParams(max_tokens=3, ignore_eos=True))
            out = run_to_completion(engine)
            results.setdefault(caching, []).append(out[f"q{i}"].outputs[0].token_ids)
        results[caching, "fed"] = executor.fed
        results[caching, "stats"] = engine.stats()
    assert results[True] == results[False]
    on = results[True, "stats"]
    # The first request computes the 32 shared tokens; the other five find them cached.
    assert on.prefix_cache_hits == 5 * 32 and on.prefix_cache_queries == 6 * 34
    assert results[False, "fed"] - results[True, "fed"] == 5 * 32
    assert results[False, "stats"].prefix_cache_queries == 0


def test_a_fully_cached_prompt_still_computes_its_last_token():
    engine = make_engine(num_gpu_blocks=32, max_model_len=64)
    prompt = list(range(40, 56))                 # exactly 4 blocks
    outs = []
    for i in range(2):
        engine.add_request(f"r{i}", prompt_token_ids=prompt,
                           sampling_params=SamplingParams(max_tokens=4, ignore_eos=True))
        outs.append(run_to_completion(engine)[f"r{i}"])
    assert outs[0].outputs[0].token_ids == outs[1].outputs[0].token_ids
    # Three blocks served; the fourth is recomputed for the last token's logits.
    assert outs[1].metrics.num_cached_tokens == 12


def test_an_abort_mid_prefill_leaves_no_reference_and_its_sharer_finishes():
    engine = make_engine(num_gpu_blocks=32, max_model_len=128, max_num_batched_tokens=8)
    shared = list(range(40, 64))                 # 6 blocks
    params = SamplingParams(max_tokens=4, ignore_eos=True)
    engine.add_request("first", prompt_token_ids=shared + [70], sampling_params=params)
    reference = run_to_completion(engine)["first"].outputs[0].token_ids
    engine.add_request("a", prompt_token_ids=shared + list(range(90, 110)), sampling_params=params)
    engine.add_request("b", prompt_token_ids=shared + [70], sampling_params=params)
    engine.step()                  # a claims the 6 cached blocks and prefills 8 more tokens
    bm = engine.scheduler.block_manager
    a = engine.scheduler.state.requests["a"]
    assert a.num_computed_tokens == 24 + 8 < a.num_prompt_tokens
    engine.abort_request("a")                    # mid-prefill
    engine.scheduler.check_integrity()
    out = run_to_completion(engine)
    assert out["b"].outputs[0].token_ids == reference
    assert bm.num_free_blocks == 32 and not bm.owners()


def test_an_executor_failure_forgets_the_cache():
    engine = make_engine(num_gpu_blocks=32, max_model_len=64)
    params = SamplingParams(max_tokens=2, ignore_eos=True)
    engine.add_request("r0", prompt_token_ids=list(range(40, 60)), sampling_params=params)
    run_to_completion(engine)
    bm = engine.scheduler.block_manager
    assert len(bm.prefix) > 0
    inner = engine.executor.execute
    engine.executor.execute = lambda batch: (_ for _ in ()).throw(RuntimeError("lost"))
    engine.add_request("r1", prompt_token_ids=list(range(40, 60)), sampling_params=params)
    engine.step()
    engine.executor.execute = inner
    assert len(bm.prefix) == 0                   # the pool may be gone: nothing served from it
    engine.scheduler.check_integrity()


def test_no_prefix_caching_flag_reaches_the_scheduler():
    llm = LLM("fake", num_gpu_blocks=32, block_size=4, enable_prefix_caching=False)
    assert llm.engine.scheduler.block_manager.prefix is None
    llm.close()


@pytest.mark.parametrize("policy", ["vllm", "alise"])
def test_a_real_tiny_model_gives_the_same_tokens_with_caching_on_and_off(policy):
    system = "you are a helpful assistant who answers in short sentences. "
    prompts = [system + q for q in ("the quick brown fox", "jumps over", "the lazy dog")]
    prompts += [prompts[0] + " and then", prompts[1] + " the fence again"]
    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    tokens = {}
    for caching in (False, True):
        llm = LLM("opt-tiny", policy=policy, num_gpu_blocks=64, block_size=4, max_model_len=128,
                  max_num_batched_tokens=16, enable_prefix_caching=caching,
                  check_integrity=True)
        tokens[caching] = [[o.outputs[0].token_ids for o in llm.generate([p], params)][0]
                           for p in prompts]
        stats = llm.engine.stats()
        llm.close()
        assert (stats.prefix_cache_hits > 0) == caching
    assert tokens[True] == tokens[False]
