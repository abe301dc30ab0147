"""The real-engine check of EconoServe's ranking: its sample, pool and ranking (the runs
themselves take minutes of the real engine and are made by the command)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks import econoserve_real as real  # noqa: E402


def test_econoserve_real_scales_a_sample_into_a_pool_of_about_seven_requests():
    small = real.scaled([(227, 788), (8, 19), (839, 176)])
    assert small == [(57, 50), (4, 4), (210, 11)]          # bench keeps >= 4 tokens each way
    blocks = real.pool_blocks(small)
    mean = sum(p + o for p, o in small) / len(small)
    assert blocks * real.BLOCK_SIZE >= max(221, real.POOL_MEAN_REQUESTS * mean)
    assert (blocks - 1) * real.BLOCK_SIZE < max(221, real.POOL_MEAN_REQUESTS * mean)


def test_econoserve_real_ranks_each_sweep_by_normalized_latency():
    found = [{"policy": p, "sweep": s, "summary": {real.tables.NL: nl}}
             for s, nls in ((0, (0.2, 0.4, 0.3, 0.1)), (1, (0.2, 0.1, 0.3, 0.4)))
             for p, nl in zip(real.POLICIES, nls)]
    assert real.ranking(found, 0) == ["econoserve", "vllm", "sarathi", "vllm-v0"]
    assert real.ranking(found, 1) == ["vllm-v0", "vllm", "sarathi", "econoserve"]
