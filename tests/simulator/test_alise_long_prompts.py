"""ALISE on long prompts, simulated on the A100 / Llama-2-7B roofline with a host tier: bursts
of long prompts with short outputs (they outrank everything) arrive every second over
residents that decode long outputs, as in the Mooncake conversation trace (a burst every 3 s,
prompts ~1,000-3,500 tokens). Each run simulates ~8 s of serving in about half a second."""
import dataclasses

import pytest

from lenserve.bench.metrics import summarize
from lenserve.bench.simulation import simulate
from services.simulator.target import from_roofline, with_blocks
from tests.simulator.sim_helpers import make_spec, workload

RESIDENTS = [(100, 300, 0.0)] * 8
BURSTS = [(1800, 20, 0.3 + 1.0 * k) for k in range(8) for _ in range(4)]


@pytest.fixture(scope="module")
def target():
    return dataclasses.replace(from_roofline("a100-80g", "llama-2-7b"), overheads=None)


def _run(target, policy, num_gpu_blocks=None, options=()):
    spec = make_spec(policy, with_blocks(target, num_gpu_blocks), max_model_len=4096,
                     predictor="oracle" if policy != "vllm" else "none", swap_space_gib=8.0,
                     policy_config=tuple(options))
    run = simulate(spec, workload(*RESIDENTS, *BURSTS), float("inf"), False)
    assert all(r.success for r in run.records)
    return summarize(run.records, run.duration_s), run.stats["num_preemptions"]


def test_a_burst_of_long_prompts_pauses_and_offloads_no_resident_when_kv_is_plenty(target):
    # The default pool holds everything: vllm preempts nothing. A burst's prefill once took
    # the whole token budget, the paused residents' estimated wait looked long and they went
    # to the host tier and back (32 swaps), their token gaps up to 0.54 s against 0.15 s.
    vllm, vllm_preempted = _run(target, "vllm")
    alise, alise_preempted = _run(target, "alise")
    assert vllm_preempted == 0 and alise_preempted == 0
    assert alise["itl_ms"]["p99"] <= 1.05 * vllm["itl_ms"]["p99"]
    assert alise["ttft_ms"]["mean"] <= vllm["ttft_ms"]["mean"]


def test_admissions_leave_a_prefilling_prompt_its_blocks(target):
    # A 400-block pool (6,400 tokens) holds the residents or a burst, not both: the bursts
    # evict the residents (shortest remaining time first). Without the growth reserve, the
    # swapped residents came back into the blocks a burst's next prompt chunk needed, and
    # were evicted again the next iteration: ~220 swaps against ~60.
    _, reserved = _run(target, "alise", 400)
    _, unreserved = _run(target, "alise", 400, ["reserve_growth=false"])
    assert unreserved > 3 * reserved
