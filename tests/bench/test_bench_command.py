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
    captured = capsys.readouterr()
    table = captured.out
    assert "lenserve:vllm" in table and "lenserve:orca" in table and "Goodput" in table
    data = json.loads(out.read_text())
    assert [r["backend"] for r in data["runs"]] == ["lenserve:vllm", "lenserve:orca"]
    for entry in data["runs"]:
        assert entry["summary"]["completed"] == 4 and entry["summary"]["length_mismatches"] == 0
        assert len(entry["requests"]) == 4
        # What "auto" resolved to on this machine, in the JSON and on stderr.
        setup = entry["setup"]
        assert setup["model"] == "fake" and setup["dtype"] and setup["attention"]
        assert setup["predictor"] == "none"     # neither policy reads predictions
        assert (f"{entry['backend']}: ready in" in captured.err
                and f"(model fake, dtype {setup['dtype']}, attention {setup['attention']}, "
                    "predictor none)" in captured.err)


def test_sweep_runs_every_rate_and_draws_the_figure(tmp_path):
    out = tmp_path / "sweep.json"
    args = parse("--backends", "lenserve:vllm", *FAST, "--sweep-rates", "20,40",
                 "--result-json", str(out))
    assert bench.run_bench(args) == 0
    assert [r["request_rate"] for r in json.loads(out.read_text())["runs"]] == [20.0, 40.0]
    assert out.with_suffix(".png").read_bytes()[:4] == b"\x89PNG"


def test_trace_timestamps_replay_the_bundled_trace():
    args = parse("--backends", "lenserve:vllm", *FAST, "--dataset-name", "lengths",
                 "--trace-timestamps",
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


def test_a_backend_that_learns_starts_afresh_for_each_rate(monkeypatch):
    """A sweep replays the same prompts at every rate: a backend whose predictor learns from
    completions is rebuilt per rate and warmed up on prompts the workload does not hold."""
    from lenserve.bench.backends import BackendOptions, parse_backend_spec
    from lenserve.bench.runner import RunnerConfig
    from lenserve.commands import bench as bench_cmd

    from .fakes import SerialBackend, make_workload

    built = []

    class Learner(SerialBackend):
        learns_from_requests = True

        def __init__(self):
            super().__init__()
            self.prompts = []
            built.append(self)

        def submit(self, request, arrival_time):
            self.prompts.append(request.prompt_token_ids)
            super().submit(request, arrival_time)

    monkeypatch.setattr(bench_cmd, "create_backend", lambda spec, options: Learner())
    workload = make_workload([0.0, 0.0], prompt_len=4)
    runs = bench_cmd.run_backend(parse_backend_spec("lenserve:alise"), BackendOptions(),
                                 [workload, workload], [1.0, 2.0],
                                 RunnerConfig(show_progress=False, warmup_requests=1))
    assert len(runs) == 2 and all(r.success for run in runs for r in run.records)
    assert len(built) == 2                               # one backend per rate
    measured = {r.prompt_token_ids for r in workload.requests}
    for backend in built:
        warm, rest = backend.prompts[0], backend.prompts[1:]
        assert warm not in measured and len(warm) == 4   # same shape, other content
        assert set(rest) == measured
