"""ALISE with long prompts: a prefill chunk does not pause the decodes ranked behind it, and a
paused resident is offloaded only when a better queued request needs its room (the simulated
scenarios are in tests/simulator/test_alise_long_prompts.py)."""
import pytest
from sched_helpers import add, make_request, make_scheduler, scheduled, step

from services.scheduler.output import Budget
from services.scheduler.request import RequestStatus


def _alise(options=(), num_host_blocks=64, **overrides):
    return make_scheduler("alise", num_host_blocks=num_host_blocks,
                          policy_config=("aging_rate=0", *options), **overrides)


@pytest.mark.parametrize("reserve", [True, False])
def test_a_long_prompt_leaves_each_resident_its_decode_token(reserve):
    # Two residents decode; a 200-token prompt with a 2-token output outranks both and takes
    # four iterations of a 64-token budget to prefill.
    s = _alise([f"reserve_decodes={reserve}"], num_host_blocks=0, num_gpu_blocks=128, enable_prefix_caching=False,
               max_model_len=256)
    a, b = add(s, *(make_request(n, 4, max_tokens=60, predicted_output_len=60) for n in "ab"))
    step(s)
    long = add(s, make_request("long", 200, max_tokens=2, predicted_output_len=2))[0]
    decodes = prefilled = 0
    while long.num_output_tokens == 0:
        out, _ = step(s)
        got = scheduled(out)
        decodes += got.get("a", 0) + got.get("b", 0)
        prefilled += got.get("long", 0)
    assert prefilled == 200
    if reserve:     # 62 prompt tokens per iteration, and a token for each resident
        assert decodes == 2 * 4
    else:           # the whole budget to the prompt while it lasts: the residents wait
        assert decodes == 2


@pytest.mark.parametrize("num_gpu_blocks, status", [(16, RequestStatus.SWAPPED),
                                                    (64, RequestStatus.RUNNING)])
def test_a_paused_request_is_offloaded_only_when_a_better_queued_one_lacks_blocks(
        num_gpu_blocks, status):
    # a, b and c hold 3 blocks each; d (10 blocks of prompt) ranks ahead of c but the two-token
    # budget goes to a and b, so c pauses and d queues. Seats are plenty: only blocks count.
    s = _alise(["swap_wait_s=0.001"], num_gpu_blocks=num_gpu_blocks, max_model_len=64)
    a, b, c = (make_request(n, 8, max_tokens=60, predicted_output_len=p)
               for n, p in (("a", 4), ("b", 5), ("c", 40)))
    add(s, a, b, c)
    step(s)
    d = add(s, make_request("d", 40, max_tokens=60, predicted_output_len=30))[0]
    s.state.budget = Budget(2, 16)
    out, _ = step(s)
    assert scheduled(out) == {"a": 1, "b": 1} and d.status is RequestStatus.WAITING
    assert c.status is status and c.num_computed_tokens > 0

