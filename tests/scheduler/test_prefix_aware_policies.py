"""Length-aware policies see the prefix cache: ALISE ranks a queued request by its uncached
prefill, EconoServe sizes a prompt by its uncached blocks and counts shared blocks once."""
import pytest
from sched_helpers import add, make_scheduler, scheduled, step

from lenserve_contract.sampling_params import SamplingParams
from services.scheduler.request import Request

PREFIX = list(range(100, 160))          # 60 tokens: 15 blocks of 4


def request(rid: str, tokens: list[int], max_tokens: int = 4, predicted: int = 4) -> Request:
    return Request(rid, tokens, SamplingParams(max_tokens=max_tokens, ignore_eos=True),
                   arrival_time=0.0, eos_token_id=2, predicted_output_len=predicted)


def drain(s, limit: int = 200) -> None:
    for _ in range(limit):
        if not s.has_unfinished_requests():
            return
        step(s)
    raise AssertionError("did not drain")


@pytest.mark.parametrize("caching, first", [(False, "short"), (True, "cached")])
def test_alise_serves_a_mostly_cached_long_prompt_before_a_shorter_uncached_one(caching, first):
    s = make_scheduler("alise", max_num_seqs=1, enable_prefix_caching=caching)
    add(s, request("warm", PREFIX + [1, 2, 3, 4]))
    drain(s)
    # Same predicted output: ALISE orders by remaining time, i.e. by prefill left. The long
    # one (64 tokens) has 60 cached; the short one (24 tokens) none.
    add(s, request("short", list(range(300, 324))), request("cached", PREFIX + [5, 6, 7, 8]))
    out, _ = step(s)
    assert list(scheduled(out)) == [first]
    drain(s)


def _econoserve(caching: bool, reserve: float = 0.18, waiting: float = 0.1):
    # 64 blocks, a few reserved for prompts; outputs predicted long (200 tokens).
    return make_scheduler("econoserve", num_gpu_blocks=64, max_model_len=256,
                          max_num_batched_tokens=64, enable_prefix_caching=caching,
                          policy_config=(f"reserved_kv_fraction={reserve}",
                                         f"waiting_kv_fraction={waiting}",
                                         "default_output_len=200", "enable_pipelining=false"))


def _long(rid: str, tail: list[int]) -> Request:
    return request(rid, PREFIX + tail, max_tokens=200, predicted=200)


@pytest.mark.parametrize("caching", [False, True])
def test_econoserve_admits_a_prompt_whose_prefix_another_request_holds(caching):
    s = _econoserve(caching)                      # 12 blocks reserved for prompts
    (a,) = add(s, _long("a", [1, 2, 3, 4]))
    step(s)
    assert s.block_manager.num_blocks_of("a") >= 16
    add(s, _long("b", [5, 6, 7, 8]))
    out, _ = step(s)
    # Without sharing b needs 16 blocks, more than the reserve; with it, one new block.
    assert ("b" in scheduled(out)) == caching
    if caching:
        assert s.block_manager.block_table("b")[:15] == s.block_manager.block_table("a")[:15]


def test_econoserve_counts_blocks_prompts_share_once():
    # 20 blocks reserved for prompts; prefilled prompts may wait on up to 40 blocks.
    s = _econoserve(True, reserve=0.3, waiting=0.625)
    policy, bm = s.policy, s.block_manager
    add(s, _long("a", [1, 2, 3, 4]))
    step(s)
    add(s, _long("b", [5, 6, 7, 8]))
    step(s)
    add(s, _long("c", [9, 10, 11, 12]))
    out, _ = step(s)
    # b and c wait as GTs, 16 blocks each, 15 the same: their prompt KV is 17 blocks, and c
    # (one new block) fit the 20-block reserve; counted per request they would hold 32.
    assert "c" in scheduled(out) and {"b", "c"} <= {r.request_id for r in policy.gts.ordered()}
    assert policy._waiting_kv(bm) == 17
    assert bm.num_blocks_of("b") + bm.num_blocks_of("c") == 32


def _lpm(window: int):
    opts = (f"prefix_window={window}",) if window else ()
    s = make_scheduler("vllm", max_num_seqs=1, enable_prefix_caching=True, policy_config=opts)
    add(s, request("warm", PREFIX + [1, 2, 3, 4]))
    drain(s)
    return s


@pytest.mark.parametrize("window, first", [(0, "fresh"), (4, "cached")])
def test_vllm_prefix_window_admits_the_longest_cached_prefix_first(window, first):
    s = _lpm(window)
    add(s, request("fresh", list(range(300, 324))), request("cached", PREFIX + [5, 6, 7, 8]))
    out, _ = step(s)
    assert list(scheduled(out)) == [first]
    drain(s)


@pytest.mark.parametrize("window", [2, 3])
def test_vllm_prefix_window_lets_a_request_be_passed_at_most_window_times(window):
    s = _lpm(window)
    add(s, request("fresh", list(range(300, 324)), max_tokens=1),
        *(request(f"c{i}", PREFIX + [5, 6, i, 8], max_tokens=1) for i in range(5)))
    admitted = []
    for _ in range(40):
        out, _ = step(s)
        admitted += [rid for rid in scheduled(out) if rid not in admitted]
    assert not s.has_unfinished_requests()
    # Cached turns behind it go first, until it has been passed ``window`` times.
    assert admitted.index("fresh") == window
