"""``evaluation/predictor/holdout_seed.py``: a predictor's seed that leaves out exactly the
prompts the benchmark samples, for ShareGPT and Alpaca alike."""
import gzip
import json
import subprocess
import sys
from pathlib import Path

from lenserve.workloads.datasets import load_samples
from lenserve.workloads.sampling import SampleConfig, sample_requests
from services.executor.factory import load_tokenizer

# Run by path: it needs only the installed lenserve and services packages.
SCRIPT = Path(__file__).resolve().parents[3] / "evaluation" / "predictor" / "holdout_seed.py"


def test_an_alpaca_seed_holds_out_the_benchmark_prompts_and_reads_back(tmp_path):
    records = [{"instruction": f"Write item {i} of a list about topic {i}.",
                "input": f"context {i}" if i % 2 else "",
                "output": " ".join(["word"] * (4 + 3 * i))} for i in range(12)]
    data = tmp_path / "alpaca.json"
    data.write_text(json.dumps(records))
    held = tmp_path / "held"
    subprocess.run([sys.executable, str(SCRIPT), "--dataset-name", "alpaca", "--dataset-path",
                    str(data), "--num-prompts", "4", "--seed", "0", "--max-model-len", "40",
                    "--model", "opt-125m", "--out", str(held)], check=True,
                   capture_output=True)
    tokenizer = load_tokenizer("opt-125m")
    config = SampleConfig(num_prompts=4, seed=0, max_total_len=40)
    chosen = {s.prompt for _, s in sample_requests(load_samples("alpaca", data), config,
                                                   tokenizer)}
    others = load_samples("sharegpt", held / "others.jsonl.gz")     # what build reads
    assert len(chosen) == 4 and len(others) == 8
    assert not chosen & {s.prompt for s in others}
    # Context joined to the instruction as the benchmark's prompt is; replies kept whole.
    assert {s.reference for s in others} <= {r["output"] for r in records}
    assert any("\n\ncontext" in s.prompt for s in others)
    with gzip.open(held / "others_fit.jsonl.gz", "rt") as f:
        fit = [json.loads(line) for line in f]
    assert fit and all(
        len(tokenizer.encode(r["prompt"], add_special_tokens=False))
        + len(tokenizer.encode(r["response"], add_special_tokens=False)) <= 40 for r in fit)
    assert len(fit) < len(others)           # the longest replies do not fit 40 tokens
