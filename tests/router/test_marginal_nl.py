"""``length-aware``'s key among the pools its KV band keeps: the normalized latency a request
adds, read from the predicted remaining outputs of the requests it would join; and the band
that a replica preempting by predicted length (``alise``) is never held out by."""
from __future__ import annotations

import random

import pytest

from lenserve_contract.sampling_params import SamplingParams
from services.executor.fake import FakeExecutor
from services.router.core import Placement, RouterCore
from services.router.policies import projected_kv_share, step_time_s, wait_s
from services.router.residents import PAST_PREDICTION_TOKENS, Remaining
from services.scheduler import convert
from services.scheduler.engine_core import EngineCore
from services.scheduler.load import ReplicaLoad, replica_load
from services.scheduler.scheduler import SchedulerStats
from services.scheduler.wiring import EngineConfig, engine_parts

RATES = (4.65e-5, 1.72e-6, 0.0118)      # a simulated A100's fitted rates (T0, alpha, beta)


def load(running: int, decode: int, free: int, preempts: bool = False,
         prefill: int = 0) -> ReplicaLoad:
    stats = SchedulerStats("alise" if preempts else "vllm", 0, running, 0, free, 1536, 10, 0, 0)
    return ReplicaLoad(stats, 16, prefill, decode, 0, RATES, False, preempts)


def core_with(policy: str, residents: dict[str, list[tuple[int, int, int]]],
              reports: dict[str, ReplicaLoad]) -> RouterCore:
    """A router whose earlier placements on each replica are ``residents``: (prompt,
    predicted output, tokens produced so far) each, then a load report from each."""
    core = RouterCore(policy)
    for name in reports:
        view = core.add_replica(name)
        for i, (prompt, predicted, done) in enumerate(residents.get(name, ())):
            p = Placement(f"{name}{i}", prompt, predicted, replica=name, num_output_tokens=done)
            view.placed[p.request_id] = core.requests[p.request_id] = p
        core.on_load(name, reports[name])
    return core


def test_the_residents_sum_is_the_one_it_stands_for():
    rng = random.Random(0)
    held = [Placement(f"r{i}", 10, rng.randint(1, 500), num_output_tokens=rng.randint(0, 600))
            for i in range(200)]
    remaining = Remaining(held)

    def brute(length):
        total = 0.0
        for p in held:
            life = max(p.predicted_output_len, p.num_output_tokens + PAST_PREDICTION_TOKENS)
            total += min(life - p.num_output_tokens, length) / life
        return total
    for length in (1, 7, 50, 200, 499, 10_000):
        assert remaining.overlap(length) == pytest.approx(brute(length))
    for p in held[::2]:             # half of them finish before the next report
        remaining.finished(p.request_id)
    held = held[1::2]
    assert len(remaining) == 100
    for length in (1, 50, 499, 10_000):
        assert remaining.overlap(length) == pytest.approx(brute(length))
    assert Remaining([]).overlap(100) == 0.0


def test_a_request_goes_where_its_steps_cost_the_others_least():
    # Both replicas report the same: four running requests, 800 tokens still to generate,
    # the same KV held. a's four were just placed (200 predicted, none produced): a request
    # joining them adds a step to every one of their 200 tokens. b's four are 1,000-token
    # replies with 200 to go: the same extra steps move their normalized latency a fifth as
    # much. Nothing in a report, nor a count, tells them apart; the placements do.
    reports = dict(a=load(4, 800, 1536 - 300), b=load(4, 800, 1536 - 300))
    residents = dict(a=[(100, 200, 0)] * 4, b=[(100, 1000, 800)] * 4)
    core = core_with("length-aware", residents, reports)
    assert core.place(Placement("new", 100, 200)).name == "b"
    # least-loaded sees a tie and takes the first in turn.
    assert core_with("least-loaded", residents, reports).place(
        Placement("new", 100, 200)).name == "a"


def test_a_replica_that_preempts_by_length_is_within_the_band_whatever_its_pool_holds():
    # a's pool is nearly full (two long conversations, 2,400 tokens each); b's is half full
    # with twenty requests. Under vllm a new prompt would queue on a until a conversation
    # ends: the band sends it to b. Under alise a short request takes a conversation's place
    # at once, and b's twenty requests would each pay its step: it goes to a.
    residents = dict(a=[(2000, 800, 400)] * 2, b=[(300, 300, 100)] * 20)
    for preempts, expected in ((False, "b"), (True, "a")):
        reports = dict(a=load(2, 800, 1536 - 1400, preempts),
                       b=load(20, 4000, 1536 - 750, preempts))
        core = core_with("length-aware", residents, reports)
        assert core.place(Placement("short", 50, 20)).name == expected


def test_in_arrival_order_a_request_waits_for_the_pool_to_free_as_its_requests_end():
    # Two vllm replicas, both pools projected past full, within the band of each other. a is
    # the emptier (1.03 of its pool) but its ten requests have ~500 tokens each to go: the
    # excess frees in ~15 steps. b (1.08, its queue of prompts longer) frees its excess in
    # under two steps: its requests are about to end. The batch's step alone prefers a.
    reports = dict(a=load(10, 5000, 0, prefill=1256), b=load(10, 200, 0, prefill=15334))
    core = core_with("length-aware", {}, reports)
    views = core.replicas
    new = Placement("new", 100, 200)
    share = {n: projected_kv_share(v, new) for n, v in views.items()}
    assert 1.0 < share["a"] < share["b"] < share["a"] + 0.1
    assert step_time_s(views["a"], share["a"]) < step_time_s(views["b"], share["b"])
    step = {n: step_time_s(v, share[n]) for n, v in views.items()}
    waits = {n: wait_s(v, new, share[n], step[n]) for n, v in views.items()}
    assert waits["a"] > 2 * waits["b"]
    assert core.place(new).name == "b"
    # Under alise a shorter request takes a resident's place: only its own prefill waits.
    alise = load(10, 5000, 0, preempts=True, prefill=1256)
    core.on_load("a", alise)
    assert wait_s(core.replicas["a"], new, 1.03, 0.2) == pytest.approx(RATES[0] * 100)


def _engine(policy: str) -> EngineCore:
    config = EngineConfig(model="fake", block_size=4, num_gpu_blocks=64, max_model_len=128,
                          policy=policy)
    return EngineCore(**engine_parts(config, FakeExecutor()))


@pytest.mark.parametrize("policy, preempts", [("vllm", False), ("alise", True),
                                              ("ssjf", False)])
def test_a_replica_says_whether_its_policy_preempts_by_length_and_the_contract_carries_it(
        policy, preempts):
    engine = _engine(policy)
    engine.add_request("r", prompt_token_ids=[5] * 6,
                       sampling_params=SamplingParams(max_tokens=8), predicted_output_len=8)
    report = replica_load(engine)
    assert report.preempts_by_length is preempts
    assert convert.load_from_pb(convert.load_to_pb(report)).preempts_by_length is preempts
