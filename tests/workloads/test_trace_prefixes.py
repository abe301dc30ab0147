"""Mooncake's hash_ids become shared token prefixes: rows with the same leading hash ids get
the same leading tokens, so a prefix cache can serve exactly what the trace says is shared;
--trace-block-tokens scales every prompt alike."""
import gzip
import json
import os

import pytest

from lenserve.workloads.datasets import load_samples
from lenserve.workloads.multiturn import ideal_hit_tokens
from lenserve.workloads.sampling import SampleConfig, sample_requests
from services.executor.fake import CharTokenizer

TRACE = "/work/shared/data/mooncake_conversation_trace.jsonl.gz"


def _write(tmp_path, rows):
    path = tmp_path / "trace.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    return path


def test_equal_hash_ids_give_equal_tokens_and_the_rest_differs(tmp_path):
    rows = [{"timestamp": 0, "input_length": 1200, "output_length": 10, "hash_ids": [0, 1, 2]},
            {"timestamp": 5, "input_length": 1300, "output_length": 10, "hash_ids": [0, 1, 3]},
            {"timestamp": 9, "input_length": 100, "output_length": 10, "hash_ids": [4]}]
    samples = load_samples("mooncake", _write(tmp_path, rows))
    cfg = SampleConfig(3, max_prompt_len=4000, max_total_len=8000, contiguous=True)
    a, b, c = (r for r, _ in sample_requests(samples, cfg, CharTokenizer()))
    assert (a.prompt_len, b.prompt_len, c.prompt_len) == (1200, 1300, 100)
    assert a.prompt_token_ids[:1024] == b.prompt_token_ids[:1024]
    assert a.prompt_token_ids[1024:1100] != b.prompt_token_ids[1024:1100]
    assert a.prompt_token_ids[:100] != c.prompt_token_ids
    total, hits = ideal_hit_tokens([a.prompt_token_ids, b.prompt_token_ids], 16)
    assert hits == 1024 and total == 2500


def test_trace_block_tokens_scale_prompts_and_keep_the_sharing(tmp_path):
    rows = [{"timestamp": 0, "input_length": 1200, "output_length": 10, "hash_ids": [0, 1, 2]},
            {"timestamp": 5, "input_length": 1300, "output_length": 10, "hash_ids": [0, 1, 3]}]
    samples = load_samples("mooncake", _write(tmp_path, rows))
    cfg = SampleConfig(2, contiguous=True, trace_block_tokens=32)
    a, b = (r for r, _ in sample_requests(samples, cfg, CharTokenizer()))
    assert (a.prompt_len, b.prompt_len) == (75, 82)          # 1200/16, 1300/16 rounded up
    assert a.prompt_token_ids[:64] == b.prompt_token_ids[:64]
    assert a.prompt_token_ids[64:] != b.prompt_token_ids[64:75]
    with pytest.raises(ValueError, match="trace-block-tokens"):
        SampleConfig(2, trace_block_tokens=0)


@pytest.mark.skipif(not os.path.exists(TRACE), reason="shared data not here")
def test_the_conversation_trace_shares_much_of_its_prompts():
    samples = load_samples("mooncake", TRACE)[:300]
    assert all(s.hash_ids for s in samples)
    cfg = SampleConfig(280, contiguous=True, max_prompt_len=10**6, max_total_len=10**6,
                       trace_block_tokens=16)
    prompts = [r.prompt_token_ids for r, _ in sample_requests(samples, cfg, CharTokenizer())]
    total, hits = ideal_hit_tokens(prompts, 16)
    assert 0.05 < hits / total < 0.95
    with gzip.open(TRACE, "rt") as f:
        first = json.loads(next(f))
    assert samples[0].hash_ids == tuple(first["hash_ids"])
