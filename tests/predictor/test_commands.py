import argparse
import os

import pytest

from lenserve.commands import predictor as cmd
from services.predictor.__main__ import mlp_path
from services.predictor.config import StoreConfig
from services.predictor.store import LengthStore

ALPACA = "/work/shared/data/alpaca_data_1k_random_subset.json"


def _parse(argv):
    parser = argparse.ArgumentParser()
    cmd.register(parser.add_subparsers(dest="command"))
    return parser.parse_args(argv)


def test_build_seeds_a_persistent_db_and_saves_the_mlp(tmp_path, capsys):
    db = str(tmp_path / "db")
    args = _parse(["predictor", "build", "--dataset-name", "alpaca", "--dataset-path", ALPACA,
                   "--num-train", "40", "--qdrant-path", db, "--model", "served"])
    assert args.func(args) == 0
    assert "seeded 40 records" in capsys.readouterr().out
    store = LengthStore(StoreConfig(qdrant_path=db), dim=384)
    assert store.models() == ["served"] and 30 <= store.count("served") <= 40
    store.close()
    assert os.path.exists(mlp_path(args_config(db), "served"))


def args_config(db):
    from services.predictor.config import PredictorConfig

    return PredictorConfig(store=StoreConfig(qdrant_path=db))


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


def test_build_with_finetune_leaves_the_encoder_that_serve_uses(tmp_path, capsys):
    import asyncio

    from services.predictor.__main__ import config_from_args, serve_async
    from services.predictor.embedder import Embedder

    db = str(tmp_path / "db")
    args = _parse(["predictor", "build", "--dataset-name", "alpaca", "--dataset-path", ALPACA,
                   "--num-train", "40", "--qdrant-path", db, "--model", "served",
                   "--finetune-epochs", "1", "--finetune-layers", "2", "--max-seq-length", "16"])
    assert args.func(args) == 0
    assert "encoder fine-tuned on 40 records" in capsys.readouterr().out
    serve = _parse(["predictor", "serve", "--qdrant-path", db])
    config = config_from_args(serve)
    assert config.embedder.encoder_path == db + "-encoder"
    emb = Embedder(config.embedder)
    # The window and depth it was trained with, without being told again.
    assert emb.max_seq_length == 16
    assert emb.model[0].auto_model.config.num_hidden_layers == 2
    # The stock encoder must not serve vectors another encoder made.
    stock = _parse(["predictor", "serve", "--qdrant-path", db, "--encoder",
                    Embedder().path, "--port", "0"])
    assert asyncio.run(serve_async(stock)) == 2


def test_finetune_without_a_place_for_the_encoder_is_refused():
    args = _parse(["predictor", "build", "--dataset-name", "alpaca", "--dataset-path", ALPACA,
                   "--num-train", "40", "--finetune-epochs", "1"])
    with pytest.raises(SystemExit, match="--encoder-out"):
        args.func(args)
