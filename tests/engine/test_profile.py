"""The engine's step profile: every step is counted and its parts add up."""
from __future__ import annotations

import pytest
from engine_helpers import make_engine, run_to_completion

from services.scheduler.profile import StepProfile
from lenserve_contract.sampling_params import SamplingParams


def test_profile_counts_every_step_and_parts_fit_inside():
    engine = make_engine()
    for i in range(3):
        engine.add_request(str(i), prompt_token_ids=[5] * (4 + i),
                           sampling_params=SamplingParams(max_tokens=6, ignore_eos=True))
    steps = 0
    while engine.has_unfinished_requests():
        engine.step()
        steps += 1
    prof = engine.profile.as_dict()
    assert prof["steps"] == steps > 0
    parts = prof["schedule_s"] + prof["executor_s"] + prof["update_s"] + prof["kv_s"]
    assert 0 < parts <= prof["step_s"] + 1e-9
    assert prof["other_s"] == pytest.approx(prof["step_s"] - parts)
    assert "ms/step" in engine.profile.summary()


def test_since_gives_the_profile_of_one_run():
    engine = make_engine()
    engine.add_request("a", prompt_token_ids=[1, 2, 3],
                       sampling_params=SamplingParams(max_tokens=4, ignore_eos=True))
    run_to_completion(engine)
    before = StepProfile(**vars(engine.profile))
    engine.add_request("b", prompt_token_ids=[1, 2],
                       sampling_params=SamplingParams(max_tokens=2, ignore_eos=True))
    run_to_completion(engine)
    delta = engine.profile.since(before)
    assert delta.steps == engine.profile.steps - before.steps == 2
    assert StepProfile().summary() == "no steps"
