"""FluidInfer's token budget sized by compute: the point where the token-wise layers saturate."""
import random

import pytest
from sched_helpers import add, make_request, make_scheduler, step

from services.scheduler.policies.token_budget import TokenBudget, saturation_tokens


def affine(fixed_s, per_token_s):
    return lambda n: fixed_s + per_token_s * n


def test_the_saturation_point_moves_with_the_fixed_cost_the_tokens_share():
    # c + b*n per iteration: per-token time c/n + b is within 25% of its best (n = 2048) from
    # about 4c/b tokens on (c/n <= 0.25 * (c/2048 + b) - ...: 322 and 40).
    assert saturation_tokens(affine(0.1, 0.001), 2048) == 322
    assert saturation_tokens(affine(0.01, 0.001), 2048) == 40
    # A curve that rises again past its best point (a measured one spills caches) saturates
    # below it, not at the end of the range.
    curve = lambda n: 0.05 + 0.001 * n + (0.002 * (n - 512) if n > 512 else 0.0)  # noqa: E731
    assert saturation_tokens(curve, 2048) == 135      # its best is at 512


def _first_batch(token_seconds, budget="auto"):
    s = make_scheduler("fluidinfer", num_gpu_blocks=512, max_model_len=64,
                       policy_config=(f"token_budget={budget}",), max_num_seqs=4,
                       max_num_batched_tokens=2048)
    s.state.token_seconds = token_seconds
    add(s, *(make_request(f"r{i}", 4, 8) for i in range(200)))
    out, _ = step(s)
    return out


def test_the_iterations_set_follows_the_cost_curve_not_a_hand_set_number():
    wide = _first_batch(affine(0.1, 0.001))        # saturates at 322 tokens
    narrow = _first_batch(affine(0.01, 0.001))     # saturates at 40 tokens
    assert wide.num_batched_tokens == 322 and len(wide.scheduled) == 81
    assert narrow.num_batched_tokens == 40 and len(narrow.scheduled) == 10
    # A hand-set budget ignores the curve; the configured maximum caps both.
    assert _first_batch(affine(0.01, 0.001), budget="100").num_batched_tokens == 100
    assert _first_batch(affine(10.0, 0.001)).num_batched_tokens == 800     # every prompt


def test_without_a_cost_model_the_budget_comes_from_the_measured_iterations():
    budget = TokenBudget("auto", 0.25)

    class State:
        token_seconds = None

    assert budget.tokens(State(), 2048) == 2048 and budget.source == "configured"
    model = budget.curve.model
    rng = random.Random(0)
    for _ in range(64):     # decodes measured at 20 ms + 1 ms per token + 1 us per context token
        n, context = rng.randint(1, 64), rng.randint(20, 200)
        model.observe(0, context * n, n, 0.02 + 0.001 * n + 1e-6 * context * n)
    assert budget.tokens(State(), 2048) == pytest.approx(77, abs=1)
    assert budget.source == "online fit"


@pytest.mark.parametrize("bad", [("token_budget=0",), ("token_budget=many",),
                                 ("saturation_tolerance=0",)])
def test_a_bad_budget_setting_is_refused(bad):
    with pytest.raises(ValueError):
        make_scheduler("fluidinfer", policy_config=bad)
