"""``lenserve bench-attention``: shape parsing, traffic model, and its correctness pass."""
import argparse
import os
import subprocess
import sys
from pathlib import Path

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest

from lenserve.commands import bench_attention
from lenserve.commands.bench_attention import BenchConfig, BenchShape


def parse(argv):
    parser = argparse.ArgumentParser()
    bench_attention.register(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(["bench-attention", *argv])


def test_shapes_parse():
    decode = BenchShape.parse("decode:32x1024")
    assert (decode.batch, decode.q_len, decode.ctx) == (32, 1, 1024)
    chunk = BenchShape.parse("chunk:2x8+30")
    assert (chunk.batch, chunk.q_len, chunk.ctx) == (2, 8, 38)
    assert BenchShape.parse("prefill:4x512").q_len == 512


@pytest.mark.parametrize("text", ["foo:1x2", "decode:x", "chunk:2x8", "decode"])
def test_bad_shape_is_named(text):
    with pytest.raises(ValueError, match="bad shape"):
        BenchShape.parse(text)


def test_traffic_counts_kv_once_plus_q_and_out():
    cfg = BenchConfig(num_heads=4, num_kv_heads=2, head_dim=8, dtype=torch.float16)
    got = bench_attention.traffic_bytes(BenchShape("x", 3, 1, 10), cfg)
    assert got == (2 * 3 * 10 * 2 * 8 + 2 * 3 * 1 * 4 * 8) * 2


def test_bad_head_counts_rejected():
    with pytest.raises(ValueError, match="multiple"):
        bench_attention.run(parse(["--num-heads", "6", "--num-kv-heads", "4"]))


@pytest.mark.skipif(torch.cuda.is_available(), reason="the no-GPU path")
def test_without_gpu_runs_correctness_pass_only(capsys):
    args = parse(["--dtype", "float32", "--num-heads", "4", "--num-kv-heads", "2",
                  "--head-dim", "32", "--shapes", "decode:2x20", "chunk:1x5+9"])
    assert bench_attention.run(args) == 0
    out = capsys.readouterr().out
    assert "timing needs a GPU" in out and "correctness: ok" in out
    assert "GB/s" not in out


@pytest.mark.skipif(torch.cuda.is_available(), reason="the no-GPU path")
def test_the_command_runs_on_a_cpu_without_triton_interpret_set():
    # As a user runs it: a fresh process whose imports (torch, transformers) load triton
    # before the command runs, with no TRITON_INTERPRET in the environment.
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = Path(__file__).resolve().parents[2]
    env["PYTHONPATH"] = os.pathsep.join([str(root), env.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [sys.executable, "-m", "lenserve.cli", "bench-attention", "--dtype", "float32",
         "--num-heads", "4", "--num-kv-heads", "2", "--head-dim", "32",
         "--shapes", "decode:2x20", "chunk:1x5+9"],
        env=env, cwd=root, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "correctness: ok" in proc.stdout
