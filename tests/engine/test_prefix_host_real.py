"""The prefix cache's host tier on the real CPU engine (opt-tiny, random weights, its own
KV pool and the in-process KV manager): a conversation's cached prefix is evicted from the
device, partly written back to the host, and its next turn is served from both tiers, with
the tokens it gets with caching off."""
from lenserve.engine.llm_engine import EngineConfig, LLMEngine
from lenserve_contract.sampling_params import SamplingParams

BLOCK = 4
FIRST = list(range(40, 72))                 # the first turn: 8 full blocks
SECOND = FIRST + list(range(72, 80))        # the next turn carries it


def _params(n: int) -> SamplingParams:
    return SamplingParams(max_tokens=n, ignore_eos=True, temperature=0.0, detokenize=False)


def _step(engine, done: dict, steps: int = 10_000) -> dict[str, list[int]]:
    for _ in range(steps):
        if not engine.has_unfinished_requests():
            break
        done.update((o.request_id, list(o.outputs[0].token_ids)) for o in engine.step()
                    if o.finished)
    return done


def _session(mode: str):
    """16 device blocks of 4 tokens. The first turn leaves 8 cached blocks (evicted tail
    first); a running request and a short one evict the 5 last, which the host tier has
    written back; the next turn arrives while the 3 first are still on the device and only
    6 blocks are free, 2 steps before the running request ends."""
    config = {"host": {"swap_space_gib": 64 * 4096 / 2**30, "prefix_cache_host_blocks": 40},
              "off": {"enable_prefix_caching": False}}.get(mode, {})
    engine = LLMEngine(EngineConfig(model="opt-tiny", block_size=BLOCK, num_gpu_blocks=16,
                                    max_model_len=64, skip_tokenizer_init=True,
                                    check_integrity=True, **config))
    engine.add_request("t1", prompt_token_ids=FIRST, sampling_params=_params(3))
    tokens = _step(engine, {})
    engine.add_request("idle", prompt_token_ids=[5, 6], sampling_params=_params(2))
    _step(engine, tokens)                   # the write-backs land meanwhile
    engine.add_request("runner", prompt_token_ids=list(range(200, 233)),
                       sampling_params=_params(7))
    _step(engine, tokens, 1)
    engine.add_request("evictor", prompt_token_ids=list(range(150, 163)),
                       sampling_params=_params(3))
    _step(engine, tokens, 4)
    engine.add_request("t2", prompt_token_ids=SECOND, sampling_params=_params(3))
    return _step(engine, tokens), engine.stats()


def test_a_turn_is_served_from_device_and_host_with_the_tokens_of_no_caching():
    off, _ = _session("off")
    device, dev = _session("device")
    host, both = _session("host")
    assert device == off and host == off and len(off) == 5
    # Device only: the 3 blocks still cached are all that the next turn finds.
    assert dev.prefix_cache_hits == 3 * BLOCK and dev.prefix_cache_host_hits == 0
    # With the host tier: the other 5 come back, and the whole first turn is served. The
    # uploads wait for free blocks instead of evicting the 3 on the device (they did, and
    # the turn was served nothing: its chain had lost its head).
    assert both.prefix_cache_host_hits == 5 * BLOCK
    assert both.prefix_cache_hits == len(FIRST)
