"""ALISE's uploads ahead of need (Alg. 2) on the real serving core: the fake executor's KV
lives in real blocks and the KV manager copies them, so a lost or stale upload changes the
tokens."""
import random

import pytest

from services.scheduler.engine_core import EngineCore
from services.scheduler.wiring import EngineConfig, engine_parts
from lenserve_contract.sampling_params import SamplingParams


def _run(upload_ahead: bool, options: tuple[str, ...] = (), observe=None, **engine: int
         ) -> tuple[dict[str, list[int]], object]:
    # A KV pool of 24 blocks of 4 tokens (~5 requests of ~20 tokens) under a stream of
    # requests whose predicted lengths rank them: short ones preempt long ones, whose KV
    # goes to the host tier and comes back.
    cfg = EngineConfig(model="fake", policy="alise", num_gpu_blocks=24, block_size=4,
                       max_model_len=64, swap_space_gib=1e-4, check_integrity=True,
                       policy_config=("aging_rate=0.05", "preempt_margin_s=0", "swap_wait_s=1",
                                      f"upload_ahead={upload_ahead}", *options), **engine)
    clock = [0.0]
    engine = EngineCore(**engine_parts(cfg), clock=lambda: clock[0])
    if observe is not None:
        real_schedule = engine.scheduler.schedule

        def schedule(now):
            out = real_schedule(now)
            observe(engine, out)
            return out
        engine.scheduler.schedule = schedule
    rng, tokens, pending = random.Random(7), {}, []
    for i in range(60):
        n = rng.choice([4, 6, 40, 50])
        pending.append((i * 3, f"r{i}", [rng.randrange(1, 200) for _ in range(8)], n))
    try:
        step = 0
        while pending or engine.has_unfinished_requests():
            while pending and pending[0][0] <= step:
                _, rid, prompt, n = pending.pop(0)
                engine.add_request(rid, prompt_token_ids=prompt, predicted_output_len=n,
                                   sampling_params=SamplingParams(max_tokens=n, ignore_eos=True))
            for out in engine.step():
                if out.finished:
                    assert out.error is None, out.error
                    tokens[out.request_id] = out.outputs[0].token_ids
            step += 1
            clock[0] += 1.0
        return tokens, engine.stats()
    finally:
        engine.close()


def test_uploads_ahead_of_need_spare_the_iterations_their_waits_with_the_same_tokens():
    before, old = _run(upload_ahead=False)
    after, new = _run(upload_ahead=True)
    assert after == before and len(after) == 60
    waits_old = 1000 * old.num_upload_waits / old.num_iterations
    waits_new = 1000 * new.num_upload_waits / new.num_iterations
    assert old.num_uploads_ahead == 0 and old.num_upload_waits > 10    # the scenario swaps
    assert new.num_uploads_ahead > 0
    assert waits_new < 0.5 * waits_old, (waits_old, waits_new)


def test_a_gpu_job_limit_above_the_batch_keeps_more_requests_on_the_device_than_run():
    """Alg. 2's M above max_num_seqs: up to M requests hold their KV on the device (uploaded
    ahead of need into the spare seats), at most max_num_seqs of them run per iteration."""
    reference, _ = _run(upload_ahead=False)
    batches, residents = [], []
    tokens, stats = _run(upload_ahead=True, options=("gpu_job_limit=5",), max_num_seqs=2,
                            observe=lambda e, out: (batches.append(len(out.scheduled)),
                                                    residents.append(len(e.scheduler.state.running))))
    assert tokens == reference
    assert max(batches) == 2 and max(residents) > 2
    assert stats.num_uploads_ahead > 0


def test_the_gpu_job_limit_must_not_be_negative():
    with pytest.raises(ValueError, match="gpu_job_limit"):
        _engine = EngineCore(**engine_parts(EngineConfig(
            model="fake", policy="alise", policy_config=("gpu_job_limit=-1",))))
