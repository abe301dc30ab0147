"""``evaluation/policies/prediction_sensitivity.py``: a policy's sustained rate on noisy true
lengths and on real predictors, as multiples of oracle's and vllm's (from result JSONs already
there)."""
import json
import subprocess
import sys
from pathlib import Path

# The checkout, where `python3 -m evaluation...` finds the package without an install.
ROOT = Path(__file__).resolve().parents[3]
MODULE = "evaluation.policies.prediction_sensitivity"


def result(path: Path, points, predicted=None):
    """A ``lenserve simulate`` result JSON: (rate, normalized latency) per run."""
    true = [10, 20, 40, 80]
    runs = [{"request_rate": rate, "summary": {"normalized_latency_s_per_token": nl},
             "requests": [{"predicted_len": p, "output_len": t, "prediction_source": "oracle",
                           "error": None} for p, t in zip(predicted or [None] * 4, true)]}
            for rate, nl in points]
    path.write_text(json.dumps({"runs": runs}))


def test_rows_give_the_rate_under_the_slo_against_oracle_and_vllm(tmp_path):
    result(tmp_path / "vllm.json", [(1, 0.05), (2, 0.15)])              # crosses 0.1 at 1.5
    result(tmp_path / "oracle.json", [(1, 0.05), (2, 0.06), (4, 0.14)])   # at 3
    result(tmp_path / "alise_oracle_0.5_0.json", [(1, 0.05), (2, 0.08), (4, 0.12)],
           predicted=[20, 20, 40, 40])                                   # crosses at 3
    result(tmp_path / "alise_oracle_0.5_1.json", [(1, 0.05), (2, 0.1), (4, 0.2)],
           predicted=[10, 20, 40, 80])                                   # at 2
    result(tmp_path / "alise_embedded.json", [(1, 0.05), (2, 0.05), (4, 0.05)],
           predicted=[80, 40, 20, 10])                                   # never: >= 4
    out = subprocess.run([sys.executable, "-m", MODULE, "--out", str(tmp_path), "--sigmas", "0.5",
                          "--seeds", "0", "1", "--predictors", "embedded", "--slo", "0.1"],
                         check=True, capture_output=True, text=True, cwd=ROOT).stdout
    rows = {line.split(" | ")[0].strip("| "): line.rstrip(" |").split(" | ")[1:]
            for line in out.splitlines() if line.startswith("| ") and "---" not in line}
    # Median relative error and Spearman over every run (seed 0: 0.25 and 0.89, seed 1:
    # exact), then x oracle and x vllm, min-max over the seeds.
    assert rows["oracle:0.5"] == ["0.12", "0.95", "0.67-1.00", "1.33-2.00"]
    assert rows["embedded"] == ["0.94", "-1.00", ">=1.33", ">=2.67"]
    assert "vllm 1.50; oracle 3.00" in out
