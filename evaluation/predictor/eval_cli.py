"""`lenserve predictor eval`: ALISE against its baselines on one split, or (--shift) seeded
from one model's replies while serving another model."""
from __future__ import annotations

import argparse
import dataclasses
import logging

import numpy as np

from evaluation.predictor.eval_vectors import VectorReuse
from services.predictor.__main__ import add_common, add_data_args, config_from_args, load_split
from services.predictor.encoder_build import add_finetune_args, finetune_config
from services.predictor.config import StoreConfig
from services.predictor.embedder import resolve_precision


def main(argv: list[str] | None = None, prog: str = "python -m evaluation.predictor") -> int:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__)
    add_eval_args(parser)
    return evaluate(parser.parse_args(argv))


def evaluate(args) -> int:
    from evaluation.predictor import evaluate as ev
    from services.predictor.proxy import ProxyConfig

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    if args.shift:
        return evaluate_shift(args)
    train, test, tokenizer = load_split(args)
    data = ev.prepare(train, test, tokenizer)
    config = dataclasses.replace(config_from_args(args), store=StoreConfig(), retrain_every=0)
    proxy = ProxyConfig(encoder_path=args.encoder, epochs=args.proxy_epochs,
                        packed=not args.padded_passes)
    finetune = finetune_config(args) if args.finetune_epochs > 0 else None
    vectors = VectorReuse(args.vector_cache)
    rows = ev.run(data, config, proxy, args.bucket_width, args.num_buckets,
                  with_proxy=args.proxy_epochs > 0, finetune=finetune, vectors=vectors)
    vectors.save()
    print(f"{args.dataset_name}: train {len(train)}, test {len(test)}; lengths in tokens of "
          f"{args.tokenizer or 'all-MiniLM-L6-v2'}")
    print(f"bucket accuracy: {ev.describe_buckets(args.bucket_width, args.num_buckets)}; "
          f"encoder window {args.max_seq_length or 32} tokens (tuned: "
          f"{finetune.max_seq_length if finetune else '-'}), {resolve_precision(args.precision)}, "
          f"torch threads {args.threads}")
    print(ev.format_table(rows))
    return 0


def evaluate_shift(args) -> int:
    from evaluation.predictor import evaluate as ev
    from evaluation.predictor import shift_eval
    from services.predictor import datasets

    if not args.shift_path:
        raise ValueError("--shift needs --shift-path: the file of the served model's replies")
    if any(x <= 0 for x in args.shift_scale):
        raise ValueError(f"--shift-scale must be positive, got {args.shift_scale}")
    seed = datasets.split(datasets.load(args.dataset_name, args.dataset_path), args.num_train,
                          0, args.seed)[0]
    # A served prompt that is also a seed record would be looked up, not predicted: the same
    # file as --dataset-path serves the records the seed left out.
    seen = {x.prompt for x in seed}
    served = [x for x in datasets.load(args.shift, args.shift_path) if x.prompt not in seen]
    observe, test = datasets.split(served, args.shift_observe, args.shift_test, args.seed)
    tokenizer = datasets.load_tokenizer(args.tokenizer)
    seed_lengths = np.array(datasets.count_tokens(tokenizer, [x.reply for x in seed]))
    observe_lengths = datasets.count_tokens(tokenizer, [x.reply for x in observe])
    test_lengths = datasets.count_tokens(tokenizer, [x.reply for x in test])
    config = dataclasses.replace(config_from_args(args), store=StoreConfig())
    finetune = finetune_config(args) if args.finetune_epochs > 0 else None
    vectors = VectorReuse(args.vector_cache)
    datas = {scale: shift_eval.ShiftData(
        ev.EvalData([x.prompt for x in seed], seed_lengths, [x.prompt for x in test],
                    shift_eval.scaled(test_lengths, scale)),
        [x.prompt for x in observe], shift_eval.scaled(observe_lengths, scale))
        for scale in args.shift_scale}
    metrics = {scale: _metric(data.seed.test_lengths, args) for scale, data in datas.items()}
    tables = {scale: [ev.Row("global mean of seed", metrics[scale](
        np.full(len(test), np.mean(seed_lengths))))] for scale in datas}
    for scale, data in datas.items():
        tables[scale] += shift_eval.run(data, config, metrics[scale], args.shift_checkpoints,
                                        vectors=vectors)
        vectors.save()
    if finetune is not None:
        # One fine-tune (on the seed data alone) serves every scale.
        def tuned_rows(tuned, _fit_s):
            for scale, data in datas.items():
                tables[scale] += shift_eval.run(data, tuned, metrics[scale],
                                                args.shift_checkpoints, " + tuned encoder",
                                                vectors)
        ev.with_tuned_encoder(next(iter(datas.values())).seed, config, finetune, tuned_rows)
    for scale, rows in tables.items():
        print(f"seed: {args.dataset_name} {len(seed)}; served: {args.shift} x{scale:g}, "
              f"{len(observe)} observed, {len(test)} test; lengths in tokens of "
              f"{args.tokenizer or 'all-MiniLM-L6-v2'}; split seed {args.seed}")
        print(ev.format_table(rows))
    return 0


def _metric(real, args):
    from evaluation.predictor import evaluate as ev

    return lambda pred, upper=None: ev.length_metrics(pred, real, upper, args.bucket_width,
                                                      args.num_buckets)


def add_eval_args(p: argparse.ArgumentParser) -> None:
    add_common(p)
    add_data_args(p)
    p.add_argument("--bucket-width", type=int, default=100)
    p.add_argument("--num-buckets", type=int, default=10)
    p.add_argument("--proxy-epochs", type=int, default=2, help="0 skips the proxy baseline")
    p.add_argument("--vector-cache", default=None, metavar="DIR",
                   help="keep the vectors of bulk-embedded prompts (seed, calibration) in DIR "
                        "for later runs with the same encoder; timings still embed")
    add_finetune_args(p, 2, "also run ALISE on an encoder fine-tuned on the training part "
                            "(0 = off)")
    g = p.add_argument_group("shift test: seeded from --dataset-*, serving another model")
    g.add_argument("--shift", choices=["sharegpt", "alpaca"], default=None,
                   help="data set whose real replies the served model gives")
    g.add_argument("--shift-path", default=None, help="its file")
    g.add_argument("--shift-scale", type=float, nargs="+", default=[1.0],
                   help="served lengths = its reply lengths times this (2: a verbose model); "
                        "several values: one table each, the seed embedded once")
    g.add_argument("--shift-observe", type=int, default=500, help="completions observed")
    g.add_argument("--shift-test", type=int, default=500, help="prompts predicted")
    g.add_argument("--shift-checkpoints", type=int, nargs="*", default=[100],
                   help="also report after this many observed completions")
