"""``benchmarks/alise_gpu.py``'s tables and text from result records (the command itself needs
a CUDA device; ``--device cpu --quick`` checks it end to end in a few minutes)."""
from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from benchmarks import alise_gpu, tables  # noqa: E402


def swap_record(codec_layers, fp_gbps, int8_gbps, link=50.0, per_request=100):
    return {"dtype": "bfloat16", "num_blocks": 2000, "blocks_per_request": per_request,
            "codec_layers": codec_layers, "swapped_bytes": 1_000_000,
            "raw": {"out_in_gbps": link},
            "fp": {"out_gbps": fp_gbps, "in_gbps": fp_gbps, "out_in_gbps": fp_gbps,
                   "ratio_to_raw": fp_gbps / link, "link_bytes_each_way": 1_000_000},
            "int8": {"out_gbps": int8_gbps, "in_gbps": int8_gbps, "out_in_gbps": int8_gbps,
                     "ratio_to_raw": int8_gbps / link, "link_bytes_each_way": 515_000}}


def serve_record(policy, rate, nl, waits=0, iterations=1000):
    return {"policy": policy, "request_rate": rate,
            "summary": {tables.NL: nl, "ttft_ms": {"mean": 10.0, "p99": 20.0},
                        "jct_ms": {"mean": 1000.0}, "num_preemptions": 3,
                        "num_upload_waits": waits, "num_uploads_ahead": 5,
                        "num_iterations": iterations, "duration_s": 2.0,
                        "output_throughput": 100.0, "completed": 10, "failed": 0}}


def test_the_swap_table_keeps_one_exact_row_per_case_and_both_codec_rows():
    rows = alise_gpu.swap_table([swap_record(1, 20.0, 2.0), swap_record(None, 19.0, 4.0)])
    body = rows[2:]
    assert len(body) == 3
    assert [r.split("|")[2].strip() for r in body] == ["exact", "INT8", "INT8"]
    assert "| 1.94 |" in body[1] and "| 0.08 |" in body[2]


def test_the_text_gives_the_ratio_per_rate_the_upload_waits_and_why_int8_trails():
    serve = [serve_record("vllm", 16, 0.015), serve_record("alise", 16, 0.005, waits=20),
             serve_record("alise (no uploads ahead)", 16, 0.010, waits=60)]
    swap = [swap_record(1, 20.0, 2.0), swap_record(None, 19.0, 4.0)]
    text = alise_gpu.summary_text(serve, swap, ["lenserve:alise at 32 req/s"], "a GPU")
    assert "3.00x at 16 req/s" in text
    assert "60.0 -> 20.0" in text and "10.00 -> 5.00 ms/token" in text
    assert "0.38-0.40x" in text and "INT8 trails the exact copy" in text
    assert "Left out by the time budget: lenserve:alise at 32 req/s" in text
    faster = alise_gpu.summary_text(serve, [swap_record(None, 4.0, 8.0)], [], "a GPU")
    assert "INT8 trails" not in faster


def test_the_serve_table_reads_each_rate_against_vllm():
    rows = alise_gpu.serve_table([serve_record("vllm", 8, 0.004), serve_record("alise", 8, 0.002)])
    alise = next(r for r in rows if "| alise |" in r)
    assert "| 2.00 |" in alise and "| 2.00 |" in alise
