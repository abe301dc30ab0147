import argparse
import logging
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from lenserve.commands import predictor as cmd
from services.predictor.__main__ import config_from_args as cmd_config
from services.predictor.__main__ import mlp_path
from services.predictor.config import StoreConfig
from services.predictor.store import LengthStore

ALPACA = "/work/shared/data/alpaca_data_1k_random_subset.json"
SHAREGPT = "/work/shared/data/sharegpt_v3_first_turn.jsonl.gz"


def _parse(argv):
    parser = argparse.ArgumentParser()
    cmd.register(parser.add_subparsers(dest="command"))
    return parser.parse_args(argv)


def test_build_seeds_a_persistent_db_and_saves_the_mlp(tmp_path, capsys, caplog):
    caplog.set_level(logging.INFO)
    db = str(tmp_path / "db")
    args = _parse(["predictor", "build", "--dataset-name", "alpaca", "--dataset-path", ALPACA,
                   "--num-train", "40", "--qdrant-path", db, "--model", "served"])
    assert args.func(args) == 0
    assert "seeded 40 records" in capsys.readouterr().out
    # Progress with counts, and why the stock encoder was kept.
    assert "embedded 40/40 prompts" in caplog.text
    assert "stock encoder: 40 records are fewer than the 2000" in caplog.text
    store = LengthStore(StoreConfig(qdrant_path=db), dim=384)
    assert store.models() == ["served"] and 30 <= store.count("served") <= 40
    store.close()
    assert os.path.exists(mlp_path(args_config(db), "served"))


def args_config(db):
    from services.predictor.config import PredictorConfig

    return PredictorConfig(store=StoreConfig(qdrant_path=db))


@pytest.mark.parametrize("argv, records, epochs", [
    ([], 2000, 2),  # enough records and a place beside the DB: the length-aware encoder
    ([], 1999, 0),
    (["--finetune-epochs", "0"], 5000, 0),
    (["--finetune-epochs", "1"], 40, 1),
    (["--qdrant-path", ":memory:"], 5000, 0),  # nowhere to keep it for serve
    (["--qdrant-path", ":memory:", "--encoder-out", "/tmp/enc"], 5000, 2),
])
def test_build_fine_tunes_the_encoder_by_default_with_enough_records(argv, records, epochs):
    from services.predictor.encoder_build import build_finetune_epochs

    args = _parse(["predictor", "build", "--dataset-name", "sharegpt", "--dataset-path", "x",
                   "--qdrant-path", "/tmp/db", *argv])
    assert build_finetune_epochs(args, records) == epochs


@pytest.mark.parametrize("command, threads", [
    (["serve"], 1),  # shares its host with the other services
    (["build", "--dataset-name", "sharegpt", "--dataset-path", "x"], 0),  # every core
    (["eval", "--dataset-name", "sharegpt", "--dataset-path", "x"], 0),
    (["build", "--dataset-name", "sharegpt", "--dataset-path", "x", "--threads", "2"], 2),
])
def test_offline_commands_use_every_core_and_the_service_one_thread(command, threads):
    args = _parse(["predictor", *command])
    assert args.threads == threads
    assert cmd_config(args).embedder.num_threads == threads


def test_a_file_of_the_other_format_is_named_with_the_fix(capsys):
    from lenserve.cli import main

    argv = ["predictor", "build", "--dataset-name", "alpaca", "--dataset-path", SHAREGPT,
            "--num-train", "40"]
    with pytest.raises(ValueError, match="looks like ShareGPT data .*use --dataset-name sharegpt"):
        _parse(argv).func(_parse(argv))
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "--dataset-name sharegpt" in err and "Extra data" not in err


def test_build_with_finetune_leaves_the_encoder_that_serve_uses(tmp_path, capsys, caplog):
    caplog.set_level(logging.INFO)
    import asyncio

    from services.predictor.__main__ import config_from_args, serve_async
    from services.predictor.embedder import Embedder

    db = str(tmp_path / "db")
    args = _parse(["predictor", "build", "--dataset-name", "alpaca", "--dataset-path", ALPACA,
                   "--num-train", "40", "--qdrant-path", db, "--model", "served",
                   "--finetune-epochs", "1", "--finetune-layers", "2", "--max-seq-length", "16"])
    assert args.func(args) == 0
    assert "encoder fine-tuned on 40 records" in capsys.readouterr().out
    assert "fine-tune epoch 1/1: 40/40 records" in caplog.text
    # fp32: on a CPU with native bf16 the default precision is bf16, where packed and padded
    # passes differ by rounding (1e-3), and the comparison below checks the layout, not it.
    serve = _parse(["predictor", "serve", "--qdrant-path", db, "--precision", "fp32"])
    config = config_from_args(serve)
    assert config.embedder.encoder_path == db + "-encoder"
    emb = Embedder(config.embedder)
    # The window and depth it was trained with, without being told again.
    assert emb.max_seq_length == 16
    assert emb.model[0].auto_model.config.num_hidden_layers == 2
    # The fine-tune keeps the layout the packed passes apply to; --padded-passes opts out.
    padded = config_from_args(_parse(["predictor", "serve", "--qdrant-path", db,
                                      "--precision", "fp32", "--padded-passes"]))
    assert emb.packed and not Embedder(padded.embedder).packed
    prompts = ["Name three primes.", "Write a long story about a lighthouse keeper " * 4, ""]
    np.testing.assert_allclose(emb.encode(prompts), Embedder(padded.embedder).encode(prompts),
                               atol=2e-6)
    # The stock encoder must not serve vectors another encoder made.
    stock = _parse(["predictor", "serve", "--qdrant-path", db, "--encoder",
                    Embedder().path, "--port", "0"])
    assert asyncio.run(serve_async(stock)) == 2
    # A DB built on that encoder without a fine-tune keeps it beside itself too.
    db2 = str(tmp_path / "db2")
    again = _parse(["predictor", "build", "--dataset-name", "alpaca", "--dataset-path", ALPACA,
                    "--num-train", "20", "--qdrant-path", db2, "--model", "served",
                    "--encoder", db + "-encoder", "--finetune-epochs", "0"])
    assert again.func(again) == 0
    assert "copied beside the DB" in capsys.readouterr().out
    config2 = config_from_args(_parse(["predictor", "serve", "--qdrant-path", db2]))
    assert config2.embedder.encoder_path == db2 + "-encoder"
    assert Embedder(config2.embedder).encoder_id == emb.encoder_id


def test_finetune_without_a_place_for_the_encoder_is_refused():
    args = _parse(["predictor", "build", "--dataset-name", "alpaca", "--dataset-path", ALPACA,
                   "--num-train", "40", "--finetune-epochs", "1"])
    with pytest.raises(SystemExit, match="--encoder-out"):
        args.func(args)


def test_serve_and_build_never_import_the_evaluation_package():
    # A fresh interpreter: another test may already have imported evaluation/ here.
    code = ("import sys; from lenserve.cli import build_parser; "
            "build_parser().parse_args(['predictor', 'serve']); "
            "build_parser().format_help(); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'evaluation'))")
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=root).stdout
    assert out.strip() == "[]"


def test_eval_without_the_evaluation_package_says_where_it_is(monkeypatch, capsys):
    # None in sys.modules makes the import fail as a missing module does.
    monkeypatch.setitem(sys.modules, "evaluation.predictor.eval_cli", None)
    with pytest.raises(SystemExit) as exc:
        _parse(["predictor", "eval", "--dataset-name", "alpaca", "--dataset-path", ALPACA])
    assert exc.value.code == 2
    assert "needs the evaluation package" in capsys.readouterr().err


def test_eval_help_lists_its_flags_through_lenserve(capsys):
    from lenserve.cli import main

    with pytest.raises(SystemExit):
        main(["predictor", "eval", "--help"])
    out = capsys.readouterr().out
    assert "usage: lenserve predictor eval" in out and "--shift-scale" in out
