import gzip
import json

import pytest

from services.predictor import datasets


def _write(path, rows, lines=False):
    text = "\n".join(json.dumps(r) for r in rows) if lines else json.dumps(rows)
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "wt", encoding="utf-8") as f:
        f.write(text)
    return str(path)


ALPACA_ROWS = [{"instruction": f"Name colour {i}.", "input": "", "output": "Red."}
               for i in range(3)]
CONVERSATIONS = [{"id": f"c{i}_0", "conversations": [{"from": "human", "value": "Hi"},
                                                      {"from": "gpt", "value": "Hello!"}]}
                 for i in range(3)]
FIRST_TURNS = [{"id": f"c{i}_0", "turn_index": 0, "prompt": "Hi", "response": "Hello!"}
               for i in range(3)]


@pytest.mark.parametrize("name, rows, lines, suffix", [
    ("alpaca", ALPACA_ROWS, False, ".json"),
    ("alpaca", ALPACA_ROWS, True, ".jsonl"),
    ("sharegpt", CONVERSATIONS, False, ".json"),
    ("sharegpt", CONVERSATIONS, True, ".jsonl.gz"),  # layout read from the content
    ("sharegpt", FIRST_TURNS, True, ".jsonl.gz"),
])
def test_each_format_loads_in_either_layout(tmp_path, name, rows, lines, suffix):
    path = _write(tmp_path / f"data{suffix}", rows, lines)
    assert datasets.sniff(path)[0] == name
    assert len(datasets.load(name, path)) == 3


def test_the_wrong_dataset_name_says_which_format_the_file_is(tmp_path):
    sharegpt = _write(tmp_path / "first.jsonl", FIRST_TURNS, lines=True)
    with pytest.raises(datasets.DatasetFormatError,
                       match=r"looks like ShareGPT data \(JSON lines .*'response'.*\), not "
                             r"Alpaca: use --dataset-name sharegpt"):
        datasets.load("alpaca", sharegpt)
    other = _write(tmp_path / "trace.jsonl", [{"timestamp": 1, "input_length": 5}], lines=True)
    with pytest.raises(datasets.DatasetFormatError,
                       match=r"not Alpaca data: .*'input_length'.*keys \['instruction', "
                             r"'output'\]"):
        datasets.load("alpaca", other)
    text = tmp_path / "notes.txt"
    text.write_text("just text")
    with pytest.raises(datasets.DatasetFormatError, match="not JSON"):
        datasets.load("sharegpt", str(text))


def test_a_first_record_too_long_to_sniff_is_left_to_the_loader(tmp_path):
    huge = [{"instruction": "x" * (2 << 20), "input": "", "output": "ok"}] + ALPACA_ROWS
    path = _write(tmp_path / "big.json", huge)
    assert datasets.sniff(path)[0] == ""
    assert len(datasets.load("alpaca", path)) == 4
