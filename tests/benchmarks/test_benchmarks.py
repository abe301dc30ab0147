"""``benchmarks/``: the stamp, the results page's sections, each command's section on tiny
inputs, and the published page against its JSON files. The commands' own measurements are not
run here (minutes each); ``policies_simulated --quick`` runs end to end on sixteen requests."""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from benchmarks import (  # noqa: E402
    executor_cpu,
    output,
    page,
    policies_cpu,
    policies_simulated,
    predictor_accuracy,
    router,
    router_simulated,
    runs,
    stamp,
)
from tests.benchmarks.bench_inputs import (  # noqa: E402
    bench_run,
    cpu_stamp,
    section_count,
    tiny_sharegpt,
)


def test_a_section_is_replaced_not_duplicated():
    text = page.replace_section(page.INTRO, "policies_cpu", "first")
    text = page.replace_section(text, "policies_cpu", "second")
    assert section_count(text, "policies_cpu") == 1
    assert "second" in text and "first" not in text
    assert text.startswith(page.INTRO.rstrip())


def test_a_new_section_takes_its_place_in_the_page_order():
    text = page.replace_section(page.INTRO, "executor_cpu", "E")
    text = page.replace_section(text, "policies_simulated", "S")
    text = page.replace_section(text, "predictor_accuracy", "P")
    assert page.section_names(text) == ["policies_simulated", "predictor_accuracy",
                                        "executor_cpu"]


def test_a_page_holding_a_section_twice_is_refused():
    text = page.replace_section(page.INTRO, "policies_cpu", "x")
    with pytest.raises(ValueError, match="more than once"):
        page.replace_section(text + text, "policies_cpu", "y")


def test_orphan_sections_are_those_without_json(tmp_path):
    out = output.Outputs(docs=tmp_path, raw=tmp_path / "raw")
    page.update(out.page, "policies_cpu", "a")
    page.update(out.page, "executor_cpu", "b")
    out.file("executor_cpu", "json").write_text("{}")
    assert page.orphan_sections(out.page, out.results) == ["policies_cpu"]


def test_the_published_page_has_no_section_without_its_json():
    docs = REPO / "docs"
    assert page.orphan_sections(docs / "results.md", docs / "results") == []


def test_stamp_names_machine_date_commit_and_versions():
    s = stamp.finish(stamp.take(), 2.0)
    assert re.fullmatch(r"[0-9a-f]{4,}(-dirty)?|unknown", s["commit"])
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d UTC", s["date"])
    assert s["machine"]["cores"] >= 1 and s["machine"]["cpu"] and s["machine"]["gpu"]
    assert {"python", "lenserve", "torch", "numpy"} <= set(s["versions"])
    assert "_cpu_start" not in s and s["wall_s"] == 2.0
    line = stamp.describe(s)
    assert s["commit"] in line and s["machine"]["cpu"] in line


def test_cpu_counts_as_shared_only_when_other_work_took_a_core_share():
    def with_others(cores):
        return {"machine": {"other_work_cores": cores}}
    assert stamp.cpu_was_shared(with_others(1.2))
    assert not stamp.cpu_was_shared(with_others(0.1))
    assert not stamp.cpu_was_shared(with_others(None))


def test_a_missing_dataset_file_says_what_to_pass(tmp_path):
    with pytest.raises(SystemExit, match="--dataset-path"):
        runs.dataset_file(tmp_path / "absent.jsonl.gz")


def test_policies_simulated_quick_writes_json_figure_and_one_section(tmp_path):
    data = tiny_sharegpt(tmp_path / "tiny.jsonl.gz")
    argv = ["--quick", "--dataset-path", str(data), "--docs", str(tmp_path / "docs"),
            "--raw", str(tmp_path / "raw")]
    assert policies_simulated.main(argv) == 0
    out = output.Outputs(docs=tmp_path / "docs", raw=tmp_path / "raw")
    record = json.loads(out.file("policies_simulated", "json").read_text())
    assert record["stamp"]["commit"] and record["lenserve_commands"][0].startswith(
        "lenserve simulate")
    assert {r["policy"] for r in record["runs"]} == {*policies_simulated.UNPREDICTED,
                                                   *policies_simulated.PREDICTED}
    assert out.file("policies_simulated", "png").stat().st_size > 0
    text = out.page.read_text()
    assert section_count(text, "policies_simulated") == 1
    assert "![" in text and "(results/policies_simulated.png)" in text
    assert page.orphan_sections(out.page, out.results) == []


def test_router_quick_writes_json_figure_and_one_section(tmp_path):
    data = tiny_sharegpt(tmp_path / "tiny.jsonl.gz")
    argv = ["--quick", "--skip-real", "--dataset-path", str(data), "--docs",
            str(tmp_path / "docs"), "--raw", str(tmp_path / "raw")]
    assert router.main(argv) == 0
    out = output.Outputs(docs=tmp_path / "docs", raw=tmp_path / "raw")
    record = json.loads(out.file("router", "json").read_text())
    assert "--replicas 8" in record["lenserve_commands"][0]
    assert {(r["inner"], r["router"]) for r in record["runs"]} == {
        (i, r) for i in router_simulated.INNER for r in router_simulated.ROUTERS}
    assert {row["router"] for row in record["sustained"]} == set(router_simulated.ROUTERS)
    assert out.file("router", "png").stat().st_size > 0
    assert section_count(out.page.read_text(), "router") == 1
    made = (tmp_path / "raw" / "sim_8_s0_vllm.json").stat().st_mtime_ns
    assert router.main([*argv, "--reuse-raw"]) == 0         # published again, not re-run
    assert (tmp_path / "raw" / "sim_8_s0_vllm.json").stat().st_mtime_ns == made
    assert section_count(out.page.read_text(), "router") == 1


def test_router_gain_is_length_aware_over_least_loaded_and_unbounded_rates_give_none():
    rows = [{"replicas": 8, "inner": "vllm", "router": "least-loaded", "k": (60.0, "")},
            {"replicas": 8, "inner": "vllm", "router": "length-aware", "k": (66.0, "")}]
    assert router_simulated.gain(rows, "k", 8, "vllm") == pytest.approx(1.1)
    rows[1]["k"] = (88.0, ">=")
    assert router_simulated.gain(rows, "k", 8, "vllm") != router_simulated.gain(rows, "k", 8,
                                                                                 "vllm")


def test_policies_cpu_section_gives_ratios_to_vllm_and_says_when_the_cpu_was_shared(tmp_path):
    found = [bench_run("vllm", 1.0, 0.4), bench_run("alise", 1.0, 0.2, {
        "median_abs_rel_error": 0.5, "count": 10, "mean_abs_rel_error": 0.6}),
        bench_run("oracle", 1.0, 0.1)]
    sec = policies_cpu.section(found, policies_cpu.FULL, "ShareGPT", cpu_stamp(1.5))
    assert "`alise` 0.50x" in sec.text and "`oracle` 0.25x" in sec.text
    assert "shared" in sec.text and "about 7 requests" in sec.text
    assert "time to first token was 120 ms at 1 req/s" in sec.text
    assert "| 1 | alise | 0.2000 | 0.50 | 120 | 9.0 | 50.0 | 0 |" in sec.tables[0][1]
    assert "shared" not in policies_cpu.section(found, policies_cpu.FULL, "ShareGPT",
                                                cpu_stamp(0.0)).text


def test_policies_cpu_wants_vllm_first():
    with pytest.raises(SystemExit, match="vllm"):
        policies_cpu.main(["--policies", "alise,vllm", "--docs", "/nonexistent"])


def eval_output() -> str:
    """A table as ``lenserve predictor eval`` prints it, by its own formatter."""
    try:
        from evaluation.predictor import evaluate as ev
    except ImportError:
        from services.predictor import evaluate as ev
    from services.predictor.metrics import LengthMetrics

    metrics = LengthMetrics(0.2, 0.9, 0.55, 0.0, 0.0, 0.5, float("nan"))
    alise = LengthMetrics(0.3, 0.7, 0.42, 0.39, 0.52, 0.4, 0.8)
    rows = [ev.Row("global mean", metrics),
            ev.Row("ALISE", alise, 14.8, 30.1, 300.0, 3.3, note="retrieval 40%, s0=0.8")]
    return "sharegpt: train 60, test 20\n" + ev.format_table(rows) + "\n"


def test_predictor_accuracy_reads_the_eval_table_the_command_prints():
    rows = predictor_accuracy.parse_table(eval_output())
    assert [r["method"] for r in rows] == ["global mean", "ALISE"]
    assert rows[1]["medRE"] == 0.42 and rows[1]["tau"] == 0.39 and rows[1]["ms/p"] == 3.3
    assert rows[1]["note"].startswith("retrieval 40%")
    sec = predictor_accuracy.section(rows, predictor_accuracy.FULL, 0, cpu_stamp(1.0))
    assert "0.420 against 0.550" in sec.text and "shared" in sec.text
    assert "proxy baseline (S3's) was left out" in sec.text
    assert "| ALISE | 0.300 | 0.420 | 0.390 | 0.520 | 3.3 |" in sec.tables[0][1]


def test_predictor_accuracy_names_the_tuned_encoder_row_when_there():
    from services.predictor.metrics import LengthMetrics
    try:
        from evaluation.predictor import evaluate as ev
    except ImportError:
        from services.predictor import evaluate as ev
    plain = LengthMetrics(0.2, 0.9, 0.55, 0.0, 0.0, 0.5, float("nan"))
    alise = LengthMetrics(0.3, 0.7, 0.42, 0.39, 0.52, 0.4, 0.8)
    tuned = LengthMetrics(0.35, 0.6, 0.44, 0.43, 0.60, 0.4, 0.8)
    table = ev.format_table([ev.Row("global mean", plain),
                             ev.Row("ALISE", alise, 14.8, 30.1, 300.0, 3.3),
                             ev.Row("ALISE + tuned encoder", tuned, 5.0, 10.2, 538.0, 1.9,
                                    note="encoder fine-tuned in 59s")])
    rows = predictor_accuracy.parse_table("sharegpt: train 60, test 20\n" + table + "\n")
    assert [r["method"] for r in rows][-1] == "ALISE + tuned encoder"
    sec = predictor_accuracy.section(rows, predictor_accuracy.FULL, 0, cpu_stamp(0.0))
    assert "ALISE reaches Spearman 0.600, Kendall 0.430" in sec.text
    plain = predictor_accuracy.section(predictor_accuracy.parse_table(eval_output()),
                                       predictor_accuracy.FULL, 0, cpu_stamp(0.0))
    assert "encoder fine-tuned on" not in plain.text


def test_predictor_accuracy_refuses_output_without_its_table():
    with pytest.raises(ValueError, match="format"):
        predictor_accuracy.parse_table("no table here\n")


def test_executor_section_from_the_commands_json():
    rows = [{"batch_size": b, "prefill_s": 0.01 * b, "prefill_tokens_per_s": 12800 / b,
             "decode_s": 0.02, "decode_tokens_per_s": b / 0.02, "decode_floor_s": 0.005,
             "decode_floor_tokens_per_s": b / 0.005} for b in (1, 8)]
    result = {"model": "opt-125m", "dtype": "bfloat16", "attention_backend": "cpu",
              "cpu_threads": 2, "prompt_len": 128, "context_len": 512,
              "copy_bandwidth_bytes_per_s": 1e10, "rows": rows}
    sec = executor_cpu.section(result, cpu_stamp(0.0))
    assert "400 tok/s (batch 8)" in sec.text and "10.0 GB/s" in sec.text
    assert "| 8 | 1600 | 80.0 | 400 | 20.0 | 5.00 | 4.0 |" in sec.tables[0][1]


def test_the_commit_is_dirty_for_changed_code_not_for_the_results_written(tmp_path):
    import subprocess

    def git(*args):
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)
    (tmp_path / "docs" / "results").mkdir(parents=True)
    (tmp_path / "code.py").write_text("x = 1\n")
    (tmp_path / "docs" / "results.md").write_text("# Results\n")
    (tmp_path / "docs" / "results" / "a.json").write_text("{}\n")
    git("init", "-q")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "c")
    (tmp_path / "docs" / "results.md").write_text("# Results\n\nnew\n")
    (tmp_path / "docs" / "results" / "a.json").write_text('{"a": 1}\n')
    assert not stamp.commit(tmp_path).endswith("-dirty")
    (tmp_path / "code.py").write_text("x = 2\n")
    assert stamp.commit(tmp_path).endswith("-dirty")


def test_router_hop_only_measures_the_hop_again_and_keeps_every_other_figure(tmp_path,
                                                                           monkeypatch):
    data = tiny_sharegpt(tmp_path / "tiny.jsonl.gz")
    argv = ["--quick", "--skip-real", "--dataset-path", str(data), "--docs",
            str(tmp_path / "docs"), "--raw", str(tmp_path / "raw")]
    assert router.main(argv) == 0
    out = output.Outputs(docs=tmp_path / "docs", raw=tmp_path / "raw")
    with pytest.raises(SystemExit, match="no real section"):
        router.main([*argv, "--hop-only"])
    record = json.loads(out.file("router", "json").read_text())
    old_hop = {"num": 5, "load_avg": 0.1, "place_us_mean": 50.0,
               **{k: {"p50": 9.0, "p90": 9.0, "p99": 9.0}
                  for k in ("direct_ttft_ms", "routed_ttft_ms", "added_ttft_ms",
                            "added_e2e_ms")}}
    record["real"] = {"params": {**router.REAL_QUICK, "hop_runs": 2, "hop_pairs": 5},
                      "kill": {"lost_not_started": 0, "failed_started": 1},
                      "loaded": [{"router": r, "run": 0, "rate": 4.0, "failures": {},
                                  "summary": {"ttft_ms": {"mean": 1.0, "p99": 2.0},
                                              "normalized_latency_s_per_token": 0.1,
                                              "failed": 0}}
                                 for r in router.router_real.ROUTERS],
                      "hop": [old_hop]}
    out.file("router", "json").write_text(json.dumps(record))
    pairs = []

    def fake_measure(raw, num):
        pairs.append(num)
        return {**old_hop, "num": num, "added_ttft_ms": {"p50": 0.5 + len(pairs) / 10,
                                                         "p90": 1.0, "p99": 2.0}}
    monkeypatch.setattr(router.router_hop, "measure", fake_measure)
    assert router.main([*argv, "--hop-only"]) == 0
    assert pairs == [5, 5]                  # the page's own hop parameters, run again
    again = json.loads(out.file("router", "json").read_text())
    assert again["runs"] == record["runs"] and again["sustained"] == record["sustained"]
    assert [h["added_ttft_ms"]["p50"] for h in again["real"]["hop"]] == [0.6, 0.7]
    assert again["real"]["carried_from"]["commit"] == record["stamp"]["commit"]
    text = out.page.read_text()
    assert "adds 0.60-0.70 ms" in text and "Only the hop was measured" in text
    assert section_count(text, "router") == 1
    assert router.main([*argv, "--hop-only"]) == 0      # again: still the first page's figures
    third = json.loads(out.file("router", "json").read_text())
    assert third["real"]["carried_from"] == again["real"]["carried_from"]
    assert third["stamp"]["date"] != record["stamp"]["date"] or third["runs"] == record["runs"]
