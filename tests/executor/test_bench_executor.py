"""The bench-executor command measures what it reports, on a tiny preset."""
from __future__ import annotations

import argparse
import json

import pytest

from lenserve.commands import bench_executor


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    bench_executor.register(parser.add_subparsers())
    return parser.parse_args(["bench-executor", *argv])


def test_reports_prefill_decode_and_floor(tmp_path, capsys):
    out = tmp_path / "r.json"
    args = parse(["--model", "opt-tiny", "--batch-sizes", "1,3", "--prompt-len", "8",
                  "--context-len", "20", "--repeats", "1", "--device", "cpu", "--json", str(out)])
    assert args.func(args) == 0
    result = json.loads(out.read_text())
    assert [r["batch_size"] for r in result["rows"]] == [1, 3]
    for row in result["rows"]:
        tokens = row["batch_size"] * 8
        assert row["prefill_tokens_per_s"] == pytest.approx(tokens / row["prefill_s"])
        assert row["decode_tokens_per_s"] == pytest.approx(row["batch_size"] / row["decode_s"])
        assert row["decode_floor_s"] > result["decode_floor_weights_s"] > 0
    assert "decode floor" in capsys.readouterr().out


def test_bad_batch_sizes_are_refused():
    with pytest.raises(SystemExit):
        parse(["--model", "opt-tiny", "--batch-sizes", "1,x"])


def test_context_past_the_model_is_refused():
    args = parse(["--model", "opt-tiny", "--context-len", "5000", "--device", "cpu"])
    with pytest.raises(ValueError, match="2048"):
        args.func(args)
