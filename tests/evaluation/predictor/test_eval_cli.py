"""`lenserve predictor eval` (evaluation/predictor/eval_cli.py): the same command through the
lenserve CLI and through `python -m evaluation.predictor`."""
import argparse

import pytest

from evaluation.predictor.eval_cli import main
from lenserve.commands import predictor as cmd

ALPACA = "/work/shared/data/alpaca_data_1k_random_subset.json"


def _parse(argv):
    parser = argparse.ArgumentParser()
    cmd.register(parser.add_subparsers(dest="command"))
    return parser.parse_args(argv)


def test_eval_prints_every_method(capsys):
    args = _parse(["predictor", "eval", "--dataset-name", "alpaca", "--dataset-path", ALPACA,
                   "--num-train", "60", "--num-test", "30", "--proxy-epochs", "0",
                   "--bucket-width", "50", "--finetune-epochs", "1", "--finetune-layers", "2",
                   "--max-seq-length", "16"])
    assert args.func(args) == 0
    out = capsys.readouterr().out
    for method in ("global mean", "retrieval only", "MLP only", "ALISE", "[450,inf)",
                   "ALISE + tuned encoder"):
        assert method in out


def test_missing_dataset_is_a_clear_error():
    args = _parse(["predictor", "eval", "--dataset-name", "sharegpt", "--dataset-path",
                   "/nonexistent.json"])
    with pytest.raises(FileNotFoundError, match="dataset file not found"):
        args.func(args)


def test_eval_shift_reports_cold_learnt_and_observed_only(capsys):
    """Seeded with Alpaca replies, serving a model 4× terser on other Alpaca prompts."""
    args = _parse(["predictor", "eval", "--dataset-name", "alpaca", "--dataset-path", ALPACA,
                   "--num-train", "200", "--shift", "alpaca", "--shift-path", ALPACA,
                   "--shift-scale", "0.25", "--shift-observe", "100", "--shift-test", "100",
                   "--shift-checkpoints", "50", "--finetune-epochs", "0", "--max-seq-length", "16",
                   "--mlp-ensemble", "1"])
    assert args.func(args) == 0
    out = capsys.readouterr().out
    names = ["cold (seed only)", "after 50 observed", "after 100 observed",
             "observed only (100)"]
    median_re = {}  # columns after the name: acc, meanRE, medRE, ...
    for line in out.splitlines():
        for name in names:
            if line.startswith(name + " "):
                median_re[name] = float(line[len(name):].split()[2])
    assert set(median_re) == set(names)
    assert median_re["after 100 observed"] < 0.5 * median_re["cold (seed only)"]
    assert "predict" in out and "observe" in out  # the latency of both


def test_a_file_of_the_other_format_is_named_with_the_fix():
    swapped = ["predictor", "eval", "--dataset-name", "sharegpt", "--dataset-path", ALPACA]
    with pytest.raises(ValueError, match="looks like Alpaca data .*use --dataset-name alpaca"):
        _parse(swapped).func(_parse(swapped))


def test_the_module_takes_the_flags_of_the_command(capsys):
    with pytest.raises(FileNotFoundError, match="dataset file not found"):
        main(["--dataset-name", "sharegpt", "--dataset-path", "/nonexistent.json"])
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "--shift-scale" in capsys.readouterr().out


def test_a_shift_without_its_file_is_refused():
    args = _parse(["predictor", "eval", "--dataset-name", "alpaca", "--dataset-path", ALPACA,
                   "--shift", "alpaca"])
    with pytest.raises(ValueError, match="--shift needs --shift-path"):
        args.func(args)


def test_a_shift_from_the_seeds_own_file_serves_only_prompts_the_seed_lacks(monkeypatch):
    """The same file as seed and served: the observed and test prompts are records the seed
    left out, so none is answered by looking it up."""
    from evaluation.predictor import shift_eval

    seen = []
    monkeypatch.setattr(shift_eval, "run", lambda data, *a, **k: seen.append(data) or [])
    args = _parse(["predictor", "eval", "--dataset-name", "alpaca", "--dataset-path", ALPACA,
                   "--num-train", "200", "--shift", "alpaca", "--shift-path", ALPACA,
                   "--shift-observe", "100", "--shift-test", "100", "--finetune-epochs", "0"])
    assert args.func(args) == 0
    (data,) = seen
    seed = set(data.seed.train_prompts)
    assert len(seed) == 200
    assert not seed & set(data.seed.test_prompts) and not seed & set(data.observe_prompts)
    assert len(set(data.seed.test_prompts)) == len(set(data.observe_prompts)) == 100
