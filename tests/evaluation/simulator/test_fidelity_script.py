"""``evaluation/simulator/fidelity.py``: real and simulated runs paired by policy and rate."""
import json

from evaluation.simulator import fidelity


def summary(e2e_mean, ttft_mean, tok_s, p99, inputs=100):
    return {"completed": 10, "total_input_tokens": inputs, "total_output_tokens": 500,
            "e2el_ms": {"mean": e2e_mean * 1000, "p99": p99 * 1000},
            "ttft_ms": {"mean": ttft_mean * 1000}, "output_throughput": tok_s}


def write(path, backend, rate, s):
    path.write_text(json.dumps({"runs": [{"backend": backend, "request_rate": rate,
                                          "summary": s}]}))
    return str(path)


def test_errors_and_tolerances_against_every_real_run(tmp_path, capsys):
    real1 = write(tmp_path / "r1.json", "lenserve:vllm", 1.0, summary(10, 1.0, 100, 20))
    real2 = write(tmp_path / "r2.json", "lenserve:vllm", 1.0, summary(8, 1.0, 100, 20))
    sim = write(tmp_path / "s.json", "sim:vllm", 1.0, summary(9, 1.05, 95, 25))
    assert fidelity.main([real1, real2, sim]) == 0
    rows = {r["metric"]: r for r in fidelity.compare([fidelity.load(real1),
                                                      fidelity.load(real2)],
                                                     fidelity.load(sim))[0]}
    e2e = rows["mean E2E (s)"]
    assert e2e["error"] == [(9 - 10) / 10, (9 - 8) / 8] and not e2e["ok"]   # +12.5% vs run 2
    assert rows["mean TTFT (s)"]["ok"] and rows["output tok/s"]["ok"]
    assert not rows["p99 E2E (s)"]["ok"]                                     # +25% > 20%
    out = capsys.readouterr().out
    assert "-10.0% to +12.5%" in out and "2 of 4 figures within tolerance" in out


def test_different_workloads_or_missing_runs_are_refused(tmp_path, capsys):
    real = write(tmp_path / "r.json", "lenserve:orca", 2.0, summary(10, 1, 100, 20))
    other = write(tmp_path / "s.json", "sim:orca", 2.0, summary(10, 1, 100, 20, inputs=99))
    assert fidelity.main([real, other]) == 1
    assert "not the same workload" in capsys.readouterr().err
    elsewhere = write(tmp_path / "s2.json", "sim:orca", 3.0, summary(10, 1, 100, 20))
    assert fidelity.main([real, elsewhere]) == 1
    assert "no simulated run for orca at 2 req/s" in capsys.readouterr().err
