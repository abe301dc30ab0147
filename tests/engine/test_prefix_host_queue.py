"""Host-tier uploads behind a queue: a turn whose prefix the host tier holds arrives behind
requests that take the device first. Its blocks are uploaded when the policy picks it and
pinned to it until it runs, so it is served from the host; uploads issued at its arrival
sat free on the device and the admissions in front of it evicted them (served nothing)."""
from engine_helpers import run_to_completion
from test_prefix_host_tier import BLOCK_BYTES, PARAMS, _engine, _serve

from lenserve_contract.sampling_params import SamplingParams

FIRST = list(range(40, 72))                 # 8 full blocks of 4 tokens
LONG = SamplingParams(max_tokens=12, ignore_eos=True)
BIG_HOST = {"swap_space_gib": 256 * BLOCK_BYTES / 2**30, "prefix_cache_host_blocks": 200}


def _queued_turn(host: bool | None):
    """host: device and host tier; None: device only; False: no caching."""
    engine, _ = _engine(True, **(BIG_HOST if host else {
        "swap_space_gib": 0, "prefix_cache_host_blocks": 0,
        "enable_prefix_caching": host is None}))
    tokens = {"t1": _serve(engine, "t1", FIRST)}
    for i in range(3):                      # the conversation's blocks leave the device
        tokens[f"x{i}"] = _serve(engine, f"x{i}", [100 + i] * 36)
    # A queue in front of the next turn: each request takes most of the 16 blocks.
    for i in range(4):
        engine.add_request(f"q{i}", prompt_token_ids=[120 + i] * 30, sampling_params=LONG)
    engine.add_request("t2", prompt_token_ids=FIRST + list(range(72, 80)),
                       sampling_params=PARAMS)
    done = run_to_completion(engine)
    tokens.update((rid, out.outputs[0].token_ids) for rid, out in done.items())
    return tokens, engine, done["t2"].metrics.num_cached_tokens


def test_a_turn_behind_a_queue_is_served_from_the_host_tier():
    off, _, _ = _queued_turn(False)
    on, engine, served = _queued_turn(True)
    assert on == off and len(on) == 9
    state = engine.scheduler.state
    # Device only, the queue evicts the first turn: the next turn finds nothing.
    assert _queued_turn(None)[2] == 0
    # With the host tier: its blocks upload once the policy picks it (7 of 8: one write-back
    # was abandoned), pinned; the running request in front grows into 2 of them (a pin never
    # keeps others out); the turn is served the 5 still pinned.
    assert served >= 5 * 4
    assert not len(state.block_manager.pins) and not state.pinned_at


def test_a_failed_upload_ends_the_request_that_would_read_it():
    # The turn is admitted as it is picked (room enough), so it would read its uploads in
    # the same iteration: one that fails ends it with an error instead of serving garbage.
    engine, _ = _engine(True, **BIG_HOST)
    _serve(engine, "t1", FIRST)
    for i in range(3):
        _serve(engine, f"x{i}", [100 + i] * 36)
    kv = engine.kv_manager

    def failing(owner, blocks):
        raise RuntimeError("copy engine gone")

    kv.swap_in = failing
    engine.add_request("t2", prompt_token_ids=FIRST + list(range(72, 80)),
                       sampling_params=PARAMS)
    done = run_to_completion(engine)            # integrity checked every step
    assert done["t2"].error == "prefix upload failed"
    assert not engine.scheduler.block_manager.owners()
    assert not len(engine.scheduler.block_manager.pins)
