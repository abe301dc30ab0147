"""`lenserve bench` end to end on the engine's model-free executor, and its input checks."""
from __future__ import annotations

import argparse
import json
import socket

import pytest

from lenserve.commands import bench


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="lenserve")
    bench.register(parser.add_subparsers(dest="command"))
    return parser.parse_args(["bench", *argv])


FAST = ("--model", "fake", "--num-prompts", "4", "--output-len", "6", "--max-prompt-len", "64",
        "--disable-tqdm")


def test_bench_prints_the_table_and_writes_json(tmp_path, capsys):
    out = tmp_path / "r.json"
    args = parse("--backends", "lenserve:vllm,lenserve:orca", *FAST, "--request-rate", "50",
                 "--goodput", "e2el:60000", "--result-json", str(out))
    assert bench.run_bench(args) == 0
    table = capsys.readouterr().out
    assert "lenserve:vllm" in table and "lenserve:orca" in table and "Goodput" in table
    data = json.loads(out.read_text())
    assert [r["backend"] for r in data["runs"]] == ["lenserve:vllm", "lenserve:orca"]
    for entry in data["runs"]:
        assert entry["summary"]["completed"] == 4 and entry["summary"]["length_mismatches"] == 0
        assert len(entry["requests"]) == 4


def test_sweep_runs_every_rate_and_draws_the_figure(tmp_path):
    out = tmp_path / "sweep.json"
    args = parse("--backends", "lenserve:vllm", *FAST, "--sweep-rates", "20,40",
                 "--result-json", str(out))
    assert bench.run_bench(args) == 0
    assert [r["request_rate"] for r in json.loads(out.read_text())["runs"]] == [20.0, 40.0]
    assert out.with_suffix(".png").read_bytes()[:4] == b"\x89PNG"


def test_trace_timestamps_replay_the_bundled_trace():
    args = parse("--backends", "lenserve:vllm", *FAST, "--trace-timestamps",
                 "--trace-time-scale", "0.01", "--seed", "3", "--max-prompt-len", "1024")
    assert bench.run_bench(args) == 0


def test_a_failing_backend_does_not_lose_the_others(capsys):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    args = parse("--backends", f"lenserve:vllm,openai:http://127.0.0.1:{dead}", *FAST)
    assert bench.run_bench(args) == 1
    captured = capsys.readouterr()
    assert "lenserve:vllm" in captured.out
    assert f"backend openai:http://127.0.0.1:{dead} failed" in captured.err


@pytest.mark.parametrize("argv,error,match", [
    (("--backends", "vllm"), ValueError, "unknown backend 'vllm'"),
    (("--request-rate", "0"), ValueError, "request rate must be > 0"),
    (("--request-rate", "-2"), ValueError, "request rate must be > 0"),
    (("--sweep-rates", "1,x"), ValueError, "--sweep-rates must be numbers"),
    (("--sweep-rates", "1,inf"), ValueError, "must be finite"),
    (("--sweep-rates", "1", "--trace-timestamps"), ValueError, "cannot be combined"),
    (("--goodput", "ttft"), ValueError, "bad --goodput"),
    (("--num-prompts", "0"), ValueError, "--num-prompts must be >= 1"),
    (("--dataset-path", "/nonexistent/trace.csv"), FileNotFoundError, "trace.csv"),
    (("--dataset-name", "azure"), ValueError, "--dataset-path is required"),
    (("--model", "no-such-model"), ValueError, "unknown model 'no-such-model'"),
])
def test_bad_input_is_refused_with_a_clear_error(argv, error, match):
    extra = () if "--model" in argv else ("--model", "fake")
    with pytest.raises(error, match=match):
        bench.run_bench(parse(*extra, *argv))


def test_unknown_dataset_name_is_an_argparse_error():
    with pytest.raises(SystemExit):
        parse("--dataset-name", "random")
