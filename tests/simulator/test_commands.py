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
