"""``benchmarks/``: the paper reproductions' and the API features' commands (fluidinfer,
model_families, econoserve_paper, prefix_caching, sampling_cost, sim_overheads, alise_paper,
parallel_sampling) on tiny inputs, and their sections."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from benchmarks import output, page  # noqa: E402
from tests.benchmarks.bench_inputs import (  # noqa: E402
    bench_run,
    cpu_stamp,
    in_process,
    section_count,
    tiny_alpaca,
    tiny_sharegpt,
)


def test_fluidinfer_quick_simulates_every_setting_and_publishes_one_section(tmp_path, monkeypatch):
    from benchmarks import fluidinfer
    in_process(monkeypatch)

    data = tiny_sharegpt(tmp_path / "tiny.jsonl.gz")
    argv = ["--quick", "--no-real", "--dataset-path", str(data), "--docs",
            str(tmp_path / "docs"), "--raw", str(tmp_path / "raw")]
    assert fluidinfer.main(argv) == 0
    out = output.Outputs(docs=tmp_path / "docs", raw=tmp_path / "raw")
    record = json.loads(out.file("fluidinfer", "json").read_text())
    assert len(record["simulated"]) == len(fluidinfer.SETTINGS)
    modes = {f"{p} [{m}]" if m else p for m, backends, _ in fluidinfer.SIM_RUNS
             for p in backends}
    assert all({r["policy"] for r in runs} == modes for runs in record["simulated"].values())
    assert section_count(out.page.read_text(), "fluidinfer") == 1
    assert page.orphan_sections(out.page, out.results) == []


def test_fluidinfer_real_table_gives_the_min_max_ratio():
    from benchmarks import fluidinfer

    def run(v, f):
        return [{"policy": "vllm", "summary": {"output_throughput": v}},
                {"policy": "fluidinfer", "summary": {"output_throughput": f}}]
    lines, ratios = fluidinfer.real_table([run(10.0, 15.0), run(20.0, 36.0)])
    assert ratios == [1.5, 1.8] and "| 2 | 20.0 | 36.0 | 1.80 | - | - |" in lines
def test_model_families_quick_writes_the_identity_table(tmp_path):
    from benchmarks import model_families
    argv = ["--quick", "--docs", str(tmp_path / "docs"), "--raw", str(tmp_path / "raw")]
    assert model_families.main(argv) == 0
    out = output.Outputs(docs=tmp_path / "docs", raw=tmp_path / "raw")
    record = json.loads(out.file("model_families", "json").read_text())
    assert record["failures"] == 0
    assert {(r["preset"], r["backend"]) for r in record["rows"]} == {
        ("gemma2-tiny", b) for b in ("torch", "cpu", "triton")}
    assert out.file("model_families", "png").stat().st_size > 0
    text = out.page.read_text()
    assert section_count(text, "model_families") == 1 and "| `gemma2-tiny` | gemma2 | 2/2 |" in text


def test_model_families_section_names_a_differing_cell():
    from benchmarks import model_families
    rows = [{"preset": "qwen3-tiny", "model_type": "qwen3", "backend": b, "prompts": 4,
             "identical": n, "ok": n == 4,
             "first_divergence": None if n == 4 else "prompt of 31 tokens, step 2: ours 5, HF 6"}
            for b, n in (("torch", 4), ("cpu", 3))]
    lines = model_families.table(rows, ["torch", "cpu"])
    assert "| `qwen3-tiny` | qwen3 | 4/4 | 3/4 **differs** |" in lines[2]
    text = model_families.summary_text(rows, {"max_tokens": 6, "prompt_lens": [5, 31]}, "cpu")
    assert "1 of 2 cells differ" in text and "qwen3-tiny on cpu: prompt of 31 tokens" in text


def test_a_run_with_failed_requests_says_so_and_sustains_no_latency_target():
    from benchmarks import tables
    failing = bench_run("econoserve", 2.0, 0.01)
    failing["summary"]["failed"] = 3
    found = [bench_run("econoserve", 1.0, 0.02), failing]
    assert "0.0100 (3 failed)" in "\n".join(tables.rate_table(found, lambda s: s[tables.NL],
                                                                "{:.4f}"))
    # Its normalized latency covers completed requests only: the rate does not count.
    assert tables.sustained_rate(tables.nl_points(found, "econoserve"), 0.05) == (1.0, "")


def test_econoserve_paper_quick_reports_sustained_rates_and_paper_metrics(tmp_path, monkeypatch):
    from benchmarks import econoserve_paper
    in_process(monkeypatch)
    argv = ["--quick", "--dataset-path",
            str(tiny_sharegpt(tmp_path / "tiny.jsonl.gz")),
            "--alpaca-path", str(tiny_alpaca(tmp_path / "alpaca.json")),
            "--docs", str(tmp_path / "docs"), "--raw", str(tmp_path / "raw")]
    assert econoserve_paper.main(argv) == 0
    out = output.Outputs(docs=tmp_path / "docs", raw=tmp_path / "raw")
    record = json.loads(out.file("econoserve_paper", "json").read_text())
    assert set(record["runs"]) == {"sharegpt", "alpaca"}
    assert {r["policy"] for r in record["runs"]["sharegpt"]} == set(econoserve_paper.ORDER)
    assert set(record["sustained"]["alpaca"]["econoserve"]) == {"NL <= 0.05", "NL <= 0.1",
                                                                "SSR >= 90%"}
    assert "multires" in econoserve_paper.ORDER
    assert {r["policy"] for r in record["runs"]["alpaca"]} == set(econoserve_paper.ORDER)
    assert set(record["sustained"]["sharegpt"]) == set(econoserve_paper.ORDER)
    assert record["packing_bound_req_s"]["sharegpt"] > 0
    text = out.page.read_text()
    assert section_count(text, "econoserve_paper") == 1
    assert "x vllm-v0" in text and "scheduler share of JCT" in text
    assert "| multires |" in text and "`multires`" in text
    assert "KV lent to guests" in text and "allocation failures" in text
    assert "x vllm-v0-swap" in text and "`econoserve-pred`" in text
    assert "--block-size 32 --num-gpu-blocks 491" in text
    assert "--policy-config padding_ratio=0 buffer_ratio=0" in text


def test_prefix_caching_quick_runs_both_parts_and_publishes_one_section(tmp_path, monkeypatch):
    """--quick end to end with the fake model for the real-engine part (no timing), the
    simulator on the first requests of the Mooncake trace (a tiny stand-in when the public
    trace is not beside the checkout) and on multi-turn ShareGPT (the bundled sample); every
    command run in this process."""
    import functools

    from benchmarks import prefix_caching
    from services.executor.models import naming
    in_process(monkeypatch)
    # The Mooncake runs synthesise prompts in the preset tokenizer's vocabulary: load it once.
    monkeypatch.setattr(naming, "preset_tokenizer", functools.cache(naming.preset_tokenizer))
    trace = prefix_caching.MOONCAKE
    if not trace.is_file():
        trace = tmp_path / "trace.jsonl"
        trace.write_text("\n".join(json.dumps(
            {"timestamp": 100 * i, "input_length": 700 + 10 * i, "output_length": 20,
             "hash_ids": [0, 1, i + 2]}) for i in range(50)))
    argv = ["--quick", "--model", "fake", "--trace", str(trace), "--docs",
            str(tmp_path / "docs"), "--raw", str(tmp_path / "raw")]
    assert prefix_caching.main(argv) == 0
    out = output.Outputs(docs=tmp_path / "docs", raw=tmp_path / "raw")
    record = json.loads(out.file("prefix_caching", "json").read_text())
    modes = {"off", "device", "host"}
    assert {r["mode"] for r in record["cpu_runs"]} == modes
    for part in ("sim_runs", "chat_runs"):
        assert {(r["policy"], r["mode"]) for r in record[part]} == {
            (p, m) for p in ("vllm", "alise") for m in modes}
    device = [r for r in record["sim_runs"] if r["mode"] == "device"]
    assert all(r["summary"]["prefix_cache_hits"] > 0 for r in device)
    assert 0 < record["ideal_hit_rate"] < 1
    assert section_count(out.page.read_text(), "prefix_caching") == 1


def test_sampling_cost_section_gives_each_modes_overhead_range():
    from benchmarks import sampling_cost
    rounds = [{str(b): {"greedy": 0.010 * k, "penalties+logprobs": 0.0103 * k,
                        "json_schema": 0.012 * k} for b in (1, 64)} for k in (1.0, 2.0)]
    paired = [{str(b): {"greedy": 1.0, "penalties+logprobs": p, "json_schema": 1.2}
               for b in (1, 64)} for p in (1.01, 1.04)]
    steps = {f"{b}/{m}": [(0.01, s), (0.02, s)] for b in (1, 64)
             for m, s in zip(sampling_cost.MODES, (0.001, 0.0012, 0.003))}
    result = {"model": "opt-125m", "dtype": "float32", "attention_backend": "cpu",
              "rounds": rounds, "paired": paired, "steps_total_and_sample_s": steps}
    params = {**sampling_cost.FULL, "rounds": 2}
    sec = sampling_cost.section(result, params, cpu_stamp(0.0))
    assert "batch 1: +1.0% to +4.0%; batch 64: +1.0% to +4.0%" in sec.text
    assert "at most +2.0% of a greedy" in sec.text and "at most +3.0% (a minimum" in sec.text
    assert ("| 1 | 10.0-20.0 | 10.3-20.6 | 12.0-24.0 | +1.0% to +4.0% | +20.0% to +20.0% | "
            "+3.0% to +3.0% | +20.0% to +20.0% | - | - | 1.00 / 1.20 / 3.00 | +2.0% | +20.0% |"
            ) in sec.tables[0][1]


def test_sampling_cost_pairs_each_step_with_greedys_step_of_the_same_turn():
    from benchmarks import sampling_cost
    # The machine slowed down halfway: per-mode minima would compare a fast greedy step with
    # a slow one; the pairs keep the 2% the mode costs.
    greedy = [(t, 0.0, t) for t in (0.10, 0.10, 0.20, 0.20, 0.20)]
    mode = [(t * 1.02, 0.0, t) for t, _, _ in greedy]
    assert sampling_cost.paired_ratio({"greedy": greedy, "m": mode}, "m") == pytest.approx(1.02)


def test_sampling_cost_quick_runs_end_to_end(tmp_path):
    from benchmarks import sampling_cost
    assert sampling_cost.main(["--quick", "--steps", "2", "--docs", str(tmp_path),
                               "--raw", str(tmp_path / "raw")]) == 0
    data = json.loads((tmp_path / "results" / "sampling_cost.json").read_text())
    assert len(data["result"]["rounds"]) == 2
    assert set(data["result"]["rounds"][0]["1"]) == set(sampling_cost.MODES)
    assert set(data["result"]["rounds_cpu"][1]["4"]) == set(sampling_cost.MODES)
    assert "sampling_cost" in page.section_names((tmp_path / "results.md").read_text())


def test_sim_overheads_quick_writes_a_file_the_simulator_reads(tmp_path):
    from benchmarks import sim_overheads
    from services.simulator.overheads import load

    out = tmp_path / "overheads.json"
    assert sim_overheads.main(["--quick", "--out", str(out)]) == 0
    charged = load(out)
    assert set(charged.scheduler) == set(sim_overheads.POLICIES)
    assert all(f.per_seq_s >= 0 and f.intercept_s >= 0 for f in charged.scheduler.values())
    assert charged.predictor_for("embedded") > 0 and charged.int8_codec_bytes_per_s > 0
    assert "sim_overheads" in charged.source


def test_sim_overheads_times_each_repeat_on_prompts_not_seen_before(monkeypatch):
    """The encoder caches vectors by prompt: a repeat over the same prompts timed cache hits."""
    from benchmarks import sim_overheads
    from services.predictor import local

    seen = []

    class Recorder:
        def predict(self, queries, model):
            seen[-1].extend(q.prompt for q in queries)
            return []

    monkeypatch.setattr(local, "make_predictor", lambda *a, **k: seen.append([]) or Recorder())
    for repeat in range(2):
        sim_overheads.measure_predictor(3, repeat)
    assert len(seen) == 2 and all(len(s) == 8 for s in seen)
    assert not set(seen[0]) & set(seen[1])


def test_the_scheduler_fit_goes_through_the_medians():
    from benchmarks.sim_overheads import fit
    f = fit({1: [0.002, 0.002, 9.0], 5: [0.006], 9: [0.010]})
    assert f["intercept_s"] == pytest.approx(0.001) and f["per_seq_s"] == pytest.approx(0.001)


def test_alise_paper_quick_publishes_its_section(tmp_path, monkeypatch):
    """The simulated figures end to end on a few requests; the real engine's and bench-swap's
    runs (their own commands are tested elsewhere) replaced by what they return."""
    from benchmarks import alise_paper

    real = [{"upload_ahead": a, "iterations": 100, "upload_waits": w, "uploads_ahead": u,
             "waits_per_1k": 10.0 * w, "output_tokens": 500, "failed": 0,
             "normalized_latency": 0.1, "pool_mean_requests": 7.0}
            for a, w, u in ((False, 12, 0), (True, 0, 12))]
    swap = {"fp": {"link_bytes_each_way": 2000, "out_in_gbps": 1.0},
            "int8": {"link_bytes_each_way": 1031, "out_in_gbps": 0.1,
                     "int8_max_error_in_steps": 0.5},
            "agreement": {"fp": {"token_agreement": 1.0}, "int8": {"token_agreement": 0.9}}}
    monkeypatch.setattr(alise_paper, "upload_waits", lambda *a: real)
    monkeypatch.setattr(alise_paper, "swap_bytes", lambda *a: swap)
    # Building the disjoint predictor tokenizes the whole ShareGPT file: the bundled seed here.
    monkeypatch.setattr(alise_paper.alise_runs, "sharegpt_predictor", lambda *a: "embedded")
    in_process(monkeypatch)
    assert alise_paper.main(["--quick", "--docs", str(tmp_path),
                             "--raw", str(tmp_path / "raw")]) == 0
    text = (tmp_path / "results.md").read_text()
    assert section_count(text, "alise_paper") == 1 and "alise / vllm-v0" in text
    data = json.loads((tmp_path / "results" / "alise_paper.json").read_text())
    assert {r["policy"] for r in data["fig6"]} == {"orca", "vllm-v0", "vllm", "alise", "oracle"}
    assert {r["policy"] for r in data["fig8"]} == {"ALISE (swap)", "Recompute", "Defer"}
    assert {r["dataset"] for r in data["fig8"]} == {"alpaca", "sharegpt"}
    assert {r["panel"] for r in data["fig6"]} == {"opt-13b", "opt-2.7b"}
    assert len({r["policy"] for r in data["accuracy"]}) == 2
    assert "1.94" in text and "120.0" in text


def test_parallel_sampling_quick_runs_end_to_end(tmp_path):
    from benchmarks import parallel_sampling
    assert parallel_sampling.main(["--quick", "--docs", str(tmp_path),
                                   "--raw", str(tmp_path / "raw")]) == 0
    data = json.loads((tmp_path / "results" / "parallel_sampling.json").read_text())
    params = data["params"]
    for r in data["result"]["rounds"]:
        # The prompt's full blocks once, then each sample's last partial block; four requests
        # each compute the whole prompt.
        shared = (params["prompt_len"] - 1) // 16 * 16
        assert r["n=4"]["prefill_tokens"] == (params["prompt_len"]
                                              + 3 * (params["prompt_len"] - shared))
        assert r["4 x n=1"]["prefill_tokens"] == 4 * params["prompt_len"]
    assert "parallel_sampling" in page.section_names((tmp_path / "results.md").read_text())


def test_prediction_error_reports_how_well_predictions_order_the_requests():
    from benchmarks.runs import prediction_error

    def reqs(pred):
        return [{"predicted_len": p, "output_len": t, "error": None}
                for p, t in zip(pred, [10, 20, 40, 80])]
    # Same median error, opposite orders: only the rank correlation tells them apart.
    assert prediction_error(reqs([20, 40, 80, 160]))["rank_correlation"] == pytest.approx(1.0)
    assert prediction_error(reqs([160, 80, 40, 20]))["rank_correlation"] == pytest.approx(-1.0)
    assert prediction_error(reqs([5, 10]))["rank_correlation"] is None
