import json
import os

import pytest

from lenserve.cli import main
from services.executor.models import naming
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


def test_a_simulation_with_counted_tokens_loads_neither_torch_nor_transformers(tmp_path):
    """They cost seconds of start-up: the cost model, the policies and the token cache need
    neither. The first run counts the prompts (and loads the tokenizer), the second must not."""
    import subprocess
    import sys
    dataset = tmp_path / "chat.json"
    dataset.write_text(json.dumps([{"conversations": [
        {"from": "human", "value": f"Question {i}? " * (1 + i % 4)},
        {"from": "gpt", "value": "An answer. " * (1 + i % 7)}]} for i in range(30)]))
    script = ("import sys; from lenserve.cli import main; "
              "rc = main(['simulate', '--hardware', 'a100-80g', '--model-shape', 'llama-2-7b', "
              "'--backends', 'sim:vllm', '--num-prompts', '20', '--request-rate', '4', "
              f"'--dataset-name', 'sharegpt', '--dataset-path', {str(dataset)!r}, "
              "'--disable-tqdm', '--predictor', 'none']); "
              "print('LOADED', rc, sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    env = {**os.environ, "LENSERVE_CACHE_DIR": str(tmp_path)}
    env.pop("TRITON_INTERPRET", None)
    runs = [subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                           env=env, timeout=300) for _ in range(2)]
    lines = [next(line for line in r.stdout.splitlines() if line.startswith("LOADED"))
             for r in runs]
    assert lines[0].startswith("LOADED 0") and "transformers" in lines[0]
    assert lines[1] == "LOADED 0 []"


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
        runs = json.loads(out.read_text())["runs"]
        for r in runs:      # the scheduler's wall time is measured, not simulated
            for key in ("schedule_ms_per_iteration", "schedule_share"):
                r["summary"].pop(key)
        return runs

    loads = []
    real = naming.model_tokenizer
    monkeypatch.setattr(naming, "model_tokenizer", lambda m: loads.append(m) or real(m))
    fresh = run("fresh.json", "--no-token-cache")
    assert not cache.exists()
    cold = run("cold.json")
    (written,) = (cache / "token-counts").iterdir()
    mtime = written.stat().st_mtime_ns
    assert len(loads) == 2
    warm = run("warm.json")
    assert fresh == cold == warm
    assert written.stat().st_mtime_ns == mtime        # nothing new to count: not rewritten
    assert len(loads) == 2      # every text counted already: the tokenizer was never loaded


def test_the_serving_pass_times_the_engines_own_iterations():
    from services.executor.runner import InProcessExecutor
    from services.simulator.profiler import SMALL_BATCH, serving_pass
    executor = InProcessExecutor("opt-tiny", num_gpu_blocks=256, block_size=16)
    points = serving_pass(executor, 60, seed=1)
    assert len(points) == 60 and all(p.median_s > 0 for p in points)
    sizes = {p.features.num_seqs for p in points}
    assert len(sizes) > 3 and max(sizes) <= SMALL_BATCH
    mixed = [p for p in points if any(q > 1 for _, q, _ in p.groups) and
             any(q == 1 for _, q, _ in p.groups)]
    assert mixed                                    # prompt chunks beside decodes
    # Every sequence's context is what the engine had computed: decodes follow their prompt.
    assert all(done > 0 for p in points for _, q, done in p.groups if q == 1)
    # The executor is left usable for the rest of the profile.
    assert Profiler(executor, repeats=1).measure(((1, 4, 0),)).median_s > 0


def test_profile_command_writes_grid_and_serving_points(tmp_path, capsys):
    from services.simulator.profile_file import load_profile
    out = tmp_path / "p.json"
    assert main(["profile", "--model", "opt-tiny", "--device", "cpu", "--out", str(out),
                 "--repeats", "1", "--max-num-batched-tokens", "64",
                 "--serving-iterations", "20", "--disable-tqdm"]) == 0
    profile = load_profile(out)
    meta = json.loads(out.read_text())["meta"]
    assert meta["serving_points"] == 20 and len(profile.points) == meta["grid_points"] + 20
    assert all(len(p.seconds) == 1 for p in profile.points[-20:])
    assert f"{len(profile.points)} points written" in capsys.readouterr().out
    # --dtype auto, as every other command: the executor's resolution of it is recorded
    from services.executor.models.loader import resolve_dtype
    data = json.loads(out.read_text())
    assert data["dtype"] == profile.shape.dtype == resolve_dtype("auto", "cpu")
    assert data["device"] == "cpu"
