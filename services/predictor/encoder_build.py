"""The encoder a predictor DB is built with: where ``build`` leaves a fine-tuned one (beside
the DB, where ``serve`` and ``embedded:DB`` find it), whether and how to fine-tune it, and the
flags that say so (shared by ``lenserve predictor build`` and ``lenserve predictor eval``)."""
from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import shutil
import time

from services.predictor.config import PredictorConfig

log = logging.getLogger("lenserve.predictor")


def encoder_beside_db(qdrant_path: str, qdrant_url: str | None) -> str | None:
    """Where build leaves a fine-tuned encoder for serve: beside an on-disk Qdrant directory."""
    if qdrant_path == ":memory:" or qdrant_url:
        return None
    return os.path.normpath(qdrant_path) + "-encoder"


def build_finetune_epochs(args, num_records: int) -> int:
    """--finetune-epochs, or by default the length-aware encoder when there are enough
    records to fine-tune it and a place beside the DB to keep it."""
    from services.predictor.finetune import AUTO_EPOCHS, AUTO_MIN_RECORDS

    if args.finetune_epochs is not None:
        return args.finetune_epochs
    if num_records < AUTO_MIN_RECORDS:
        log.info("stock encoder: %d records are fewer than the %d a fine-tune needs to "
                 "generalise", num_records, AUTO_MIN_RECORDS)
        return 0
    if not (args.encoder_out or encoder_beside_db(args.qdrant_path, args.qdrant_url)):
        log.info("stock encoder: no place to keep a fine-tuned one (give an on-disk "
                 "--qdrant-path or --encoder-out)")
        return 0
    log.info("fine-tuning the length-aware encoder on %d records (%d epochs; "
             "--finetune-epochs 0 keeps the stock one)", num_records, AUTO_EPOCHS)
    return AUTO_EPOCHS


def finetune_config(args):
    from services.predictor.finetune import DEFAULT_WINDOW
    from services.predictor.proxy import ProxyConfig

    # The base is --encoder when given, never an earlier fine-tune found beside the DB.
    return ProxyConfig(encoder_path=args.encoder, epochs=args.finetune_epochs,
                       max_seq_length=args.max_seq_length or DEFAULT_WINDOW,
                       num_layers=args.finetune_layers, seed=args.seed,
                       packed=not args.padded_passes)


def add_finetune_args(p: argparse.ArgumentParser, epochs: int | None, what: str) -> None:
    from services.predictor.finetune import DEFAULT_LAYERS

    p.add_argument("--finetune-epochs", type=int, default=epochs, help=what)
    p.add_argument("--finetune-layers", type=int, default=DEFAULT_LAYERS,
                   help="encoder layers kept by the fine-tune (0 = all)")


def copy_encoder_beside(args) -> None:
    """A DB built with --encoder DIR keeps a copy of DIR where a fine-tune would have left
    one, so that serve and ``embedded:DB`` find the encoder of its vectors untold."""
    out = encoder_beside_db(args.qdrant_path, args.qdrant_url)
    if not out or not os.path.isdir(args.encoder):
        return
    if os.path.realpath(out) == os.path.realpath(args.encoder):
        return
    if os.path.isdir(out):
        shutil.rmtree(out)
    shutil.copytree(args.encoder, out)
    print(f"encoder {args.encoder} copied beside the DB: {out}")


def fine_tune(args, config: PredictorConfig, prompts: list[str], lengths) -> PredictorConfig:
    from services.predictor.finetune import fine_tune_encoder

    out = args.encoder_out or encoder_beside_db(args.qdrant_path, args.qdrant_url)
    if not out:
        raise SystemExit("--finetune-epochs needs --encoder-out DIR (or an on-disk --qdrant-path, "
                         "beside which the encoder is saved for serve)")
    t0 = time.perf_counter()
    enc_id = fine_tune_encoder(prompts, lengths, out, finetune_config(args))
    print(f"encoder fine-tuned on {len(prompts)} records in {time.perf_counter() - t0:.0f}s: "
          f"{out} (id {enc_id})")
    return dataclasses.replace(config, embedder=dataclasses.replace(config.embedder,
                                                                    encoder_path=out))
