"""The bench-swap command measures what it reports, on a tiny preset."""
from __future__ import annotations

import argparse
import json

import pytest

from lenserve.commands import bench_swap


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    bench_swap.register(parser.add_subparsers())
    return parser.parse_args(["bench-swap", *argv])


def test_reports_bandwidth_sizes_error_and_agreement(tmp_path, capsys):
    out = tmp_path / "r.json"
    args = parse(["--model", "opt-tiny", "--num-blocks", "24", "--blocks-per-request", "5",
                  "--repeats", "1", "--new-tokens", "6", "--swap-after", "2",
                  "--device", "cpu", "--json", str(out)])
    assert args.func(args) == 0
    r = json.loads(out.read_text())
    assert r["swapped_bytes"] == 24 * r["device_block_bytes"]
    assert r["host_block_bytes_fp"] == r["device_block_bytes"]
    # opt-tiny: 2 layers x K/V x 64 channels, 16 one-byte codes per channel and block, and a
    # 2 + 2 byte scale and offset per channel for every 8 blocks.
    assert r["host_block_bytes_int8"] == 2 * 2 * 64 * 16 + 2 * 2 * 64 // 8 * 4
    # What crossed the link, measured by the manager: INT8 is packed before the copy.
    assert r["fp"]["link_bytes_each_way"] == r["swapped_bytes"]
    assert r["int8"]["link_bytes_each_way"] == 24 * r["host_block_bytes_int8"]
    for key in ("fp", "int8"):
        t = r[key]
        assert t["out_in_gbps"] == pytest.approx(
            2 * r["swapped_bytes"] / (t["out_s"] + t["in_s"]) / 1e9)
        assert t["ratio_to_raw"] == pytest.approx(t["out_in_gbps"] / r["raw"]["out_in_gbps"])
    assert 0 < r["int8"]["int8_max_error_in_steps"] <= 0.5 + 1e-3
    assert r["agreement"]["fp"] == {"token_agreement": 1.0, "sequence_agreement": 1.0}
    assert 0 <= r["agreement"]["int8"]["token_agreement"] <= 1
    text = capsys.readouterr().out
    assert "x raw" in text and "INT8" in text and "greedy agreement" in text


def test_swap_point_must_come_before_the_last_token():
    args = parse(["--model", "opt-tiny", "--new-tokens", "4", "--swap-after", "4"])
    with pytest.raises(ValueError, match="--swap-after"):
        args.func(args)


def test_bad_counts_are_refused():
    with pytest.raises(SystemExit):
        parse(["--num-blocks", "0"])
