import json

import pytest

from lenserve.cli import main
from services.simulator.profiler import Profiler, grid


def test_simulate_writes_bench_json_and_sweep_plot(tmp_path, capsys):
    out = tmp_path / "sim.json"
    code = main(["simulate", "--backends", "sim:vllm,sim:orca", "--num-prompts", "12",
                 "--sweep-rates", "0.5,2", "--max-model-len", "512", "--max-prompt-len", "128",
                 "--result-json", str(out), "--disable-tqdm"])
    assert code == 0
    data = json.loads(out.read_text())
    assert [r["backend"] for r in data["runs"]] == ["sim:vllm"] * 2 + ["sim:orca"] * 2
    assert all(r["summary"]["completed"] == 12 for r in data["runs"])
    assert out.with_suffix(".png").is_file()
    captured = capsys.readouterr()
    assert "Mean E2EL (ms)" in captured.out and "measured profile" in captured.err


def test_simulate_refuses_a_profile_of_another_model(capsys):
    assert main(["simulate", "--model", "opt-tiny", "--num-prompts", "2"]) == 2
    assert "measured on 'opt-125m', not 'opt-tiny'" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["--backends", "lenserve:vllm"], "use sim:<policy>"),
    (["--hardware", "h100"], "--hardware and --model-shape go together"),
])
def test_simulate_flag_errors(argv, message, capsys):
    assert main(["simulate", "--num-prompts", "2", *argv]) == 2
    assert message in capsys.readouterr().err


def test_profiler_times_the_real_executor():
    from services.executor.runner import InProcessExecutor
    executor = InProcessExecutor("opt-tiny", num_gpu_blocks=64, block_size=16)
    profiler = Profiler(executor, repeats=1)
    points = [profiler.measure(g) for g in grid(64, 64 * 16, 1024, large=False)[:2]]
    assert all(p.median_s > 0 and len(p.seconds) == 1 for p in points)


def test_simulate_reuses_token_counts_across_runs(tmp_path, monkeypatch):
    records = [{"conversations": [
        {"from": "human", "value": f"Tell me about topic {i}. " * (2 + i % 5)},
        {"from": "gpt", "value": "Here is what I know about it. " * (2 + i % 11)}]}
        for i in range(40)]
    dataset = tmp_path / "chat.json"
    dataset.write_text(json.dumps(records))
    cache = tmp_path / "cache"
    monkeypatch.setenv("LENSERVE_CACHE_DIR", str(cache))

    def run(name, *extra):
        out = tmp_path / name
        assert main(["simulate", "--backends", "sim:vllm", "--dataset-name", "sharegpt",
                     "--dataset-path", str(dataset), "--num-prompts", "30", "--request-rate",
                     "4", "--result-json", str(out), "--disable-tqdm", *extra]) == 0
        return json.loads(out.read_text())["runs"]

    fresh = run("fresh.json", "--no-token-cache")
    assert not cache.exists()
    cold = run("cold.json")
    (written,) = (cache / "token-counts").iterdir()
    mtime = written.stat().st_mtime_ns
    warm = run("warm.json")
    assert fresh == cold == warm
    assert written.stat().st_mtime_ns == mtime        # nothing new to count: not rewritten
