"""`lenserve predictor eval`: ALISE against its baselines on one split, or (--shift) seeded
from one model's replies while serving another model."""
from __future__ import annotations

import argparse
import dataclasses
import logging

import numpy as np

from services.predictor.__main__ import (
    add_common,
    add_data_args,
    add_finetune_args,
    config_from_args,
    finetune_config,
    load_split,
)
from services.predictor.config import StoreConfig
from services.predictor.embedder import resolve_precision


def evaluate(args) -> int:
    from services.predictor import evaluate as ev
    from services.predictor.proxy import ProxyConfig

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    if args.shift:
        return evaluate_shift(args)
    train, test, tokenizer = load_split(args)
    data = ev.prepare(train, test, tokenizer)
    config = dataclasses.replace(config_from_args(args), store=StoreConfig(), retrain_every=0)
    proxy = ProxyConfig(encoder_path=args.encoder, epochs=args.proxy_epochs)
    finetune = finetune_config(args) if args.finetune_epochs > 0 else None
    rows = ev.run(data, config, proxy, args.bucket_width, args.num_buckets,
                  with_proxy=args.proxy_epochs > 0, finetune=finetune)
    print(f"{args.dataset_name}: train {len(train)}, test {len(test)}; lengths in tokens of "
          f"{args.tokenizer or 'all-MiniLM-L6-v2'}")
    print(f"bucket accuracy: {ev.describe_buckets(args.bucket_width, args.num_buckets)}; "
          f"encoder window {args.max_seq_length or 32} tokens (tuned: "
          f"{finetune.max_seq_length if finetune else '-'}), {resolve_precision(args.precision)}, "
          f"torch threads {args.threads}")
    print(ev.format_table(rows))
    return 0


def evaluate_shift(args) -> int:
    from services.predictor import datasets, shift_eval
    from services.predictor import evaluate as ev

    if not args.shift_path:
        raise ValueError("--shift needs --shift-path: the file of the served model's replies")
    seed = datasets.split(datasets.load(args.dataset_name, args.dataset_path), args.num_train,
                          0, args.seed)[0]
    served = datasets.load(args.shift, args.shift_path)
    observe, test = datasets.split(served, args.shift_observe, args.shift_test, args.seed)
    tokenizer = datasets.load_tokenizer(args.tokenizer)
    count = lambda part, scale=1.0: shift_eval.scaled(
        datasets.count_tokens(tokenizer, [x.reply for x in part]), scale)
    data = shift_eval.ShiftData(
        ev.EvalData([x.prompt for x in seed], count(seed), [x.prompt for x in test],
                    count(test, args.shift_scale)),
        [x.prompt for x in observe], count(observe, args.shift_scale))
    config = dataclasses.replace(config_from_args(args), store=StoreConfig())
    metric = lambda pred, upper=None: ev.length_metrics(pred, data.seed.test_lengths, upper,
                                                        args.bucket_width, args.num_buckets)
    finetune = finetune_config(args) if args.finetune_epochs > 0 else None
    rows = [ev.Row("global mean of seed", metric(np.full(len(test), np.mean(
        data.seed.train_lengths))))]
    rows += shift_eval.run(data, config, metric, args.shift_checkpoints)
    if finetune is not None:
        rows += ev.with_tuned_encoder(data.seed, config, finetune, lambda tuned, _: shift_eval.run(
            data, tuned, metric, args.shift_checkpoints, " + tuned encoder"))
    print(f"seed: {args.dataset_name} {len(seed)}; served: {args.shift} x{args.shift_scale:g}, "
          f"{len(observe)} observed, {len(test)} test; lengths in tokens of "
          f"{args.tokenizer or 'all-MiniLM-L6-v2'}")
    print(ev.format_table(rows))
    return 0


def add_eval_args(p: argparse.ArgumentParser) -> None:
    add_common(p)
    add_data_args(p)
    p.add_argument("--bucket-width", type=int, default=100)
    p.add_argument("--num-buckets", type=int, default=10)
    p.add_argument("--proxy-epochs", type=int, default=2, help="0 skips the proxy baseline")
    add_finetune_args(p, 2, "also run ALISE on an encoder fine-tuned on the training part "
                            "(0 = off)")
    g = p.add_argument_group("shift test: seeded from --dataset-*, serving another model")
    g.add_argument("--shift", choices=["sharegpt", "alpaca"], default=None,
                   help="data set whose real replies the served model gives")
    g.add_argument("--shift-path", default=None, help="its file")
    g.add_argument("--shift-scale", type=float, default=1.0,
                   help="served lengths = its reply lengths times this (2: a verbose model)")
    g.add_argument("--shift-observe", type=int, default=500, help="completions observed")
    g.add_argument("--shift-test", type=int, default=500, help="prompts predicted")
    g.add_argument("--shift-checkpoints", type=int, nargs="*", default=[100],
                   help="also report after this many observed completions")
