"""Where a prediction's time goes: encoder, search + MLP, and observe, per prompt.

    python3 -m evaluation.predictor.path_timing --seed-path sharegpt_v3_first_turn.jsonl.gz \
        --served-path alpaca_data_1k_random_subset.json [--num-seed 8000] [--rounds 3] \
        [--encoder DIR] [--padded-passes] [--threads N] [--compare-passes]

Builds a predictor as `lenserve predictor eval` does (seeded from --num-seed ShareGPT first
turns, stock encoder unless --encoder, lengths in MiniLM tokens), observes 500 Alpaca
replies, then times, in batches of 32 new prompts: the encoder alone, search + MLP on those
vectors (what `predict` adds to the encoder), and `observe` of the same prompts (vectors
reused, as in service; retraining off the path). Medians over all batches, ms per prompt.
`lenserve predictor eval --shift` times the whole of predict + observe the same way; this
splits it.
"""
from __future__ import annotations

import argparse
import dataclasses
import time

import numpy as np
import torch

from evaluation.predictor.eval_vectors import VectorReuse
from evaluation.predictor.evaluate import EVAL_MODEL, build_predictor, prepare
from evaluation.predictor.shift_eval import BATCH, observe_in_batches
from services.predictor import datasets
from services.predictor.config import EmbedderConfig, PredictorConfig
from services.predictor.embedder import Embedder


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seed-path", required=True)
    p.add_argument("--served-path", required=True)
    p.add_argument("--num-seed", type=int, default=8000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--vector-cache", default=None, help="reuse bulk seed vectors (eval's flag)")
    p.add_argument("--encoder", default=None,
                   help="a sentence-transformers directory, e.g. one `predictor build` "
                        "fine-tuned (default: stock MiniLM)")
    p.add_argument("--threads", type=int, default=0,
                   help="torch threads (0: torch's default, one per core, as the predictor's "
                        "build and eval; its service defaults to 1)")
    p.add_argument("--padded-passes", action="store_true",
                   help="sentence-transformers' padded encoder passes (the predictor's flag)")
    p.add_argument("--compare-passes", action="store_true",
                   help="also time the other kind of encoder pass on every batch, right after "
                        "the path's own (same process, same batches)")
    args = p.parse_args()
    tokenizer = datasets.load_tokenizer()
    seed, _ = datasets.split(datasets.load("sharegpt", args.seed_path), args.num_seed, 0)
    served, test = datasets.split(datasets.load("alpaca", args.served_path), 500, 500)
    data = prepare(seed, test, tokenizer)
    vectors = VectorReuse(args.vector_cache)
    config = PredictorConfig(embedder=EmbedderConfig(args.encoder, packed=not args.padded_passes,
                                                     num_threads=args.threads))
    predictor = build_predictor(data, config, vectors=vectors)
    vectors.save()
    observe_in_batches(predictor, [s.prompt for s in served],
                       datasets.count_tokens(tokenizer, [s.reply for s in served]))
    predictor.retrain_hook = lambda model: None
    other = Embedder(dataclasses.replace(config.embedder, packed=args.padded_passes),
                     config.max_prompt_chars) if args.compare_passes else None
    encode, search, observe, encode_other = [], [], [], []
    for r in range(args.rounds):
        for b in range(len(data.test_prompts) // BATCH):
            chunk = slice(b * BATCH, (b + 1) * BATCH)
            predictor.embedder.cache.clear()
            t0 = time.perf_counter()
            vecs = predictor.embedder.encode(data.test_prompts[chunk], cache=True)
            t1 = time.perf_counter()
            predictor.predict_vectors(EVAL_MODEL, vecs)
            t2 = time.perf_counter()
            observe_in_batches(predictor, data.test_prompts[chunk], data.test_lengths[chunk],
                               start=len(served) + (r * len(data.test_prompts) + b) * BATCH)
            encode.append(t1 - t0)
            search.append(t2 - t1)
            observe.append(time.perf_counter() - t2)
            if other is not None:
                t3 = time.perf_counter()
                other.encode(data.test_prompts[chunk])
                encode_other.append(time.perf_counter() - t3)
    per = lambda xs: float(np.median(xs)) / BATCH * 1e3
    print(f"encoder {per(encode):.2f}, search + MLP {per(search):.3f}, observe "
          f"{per(observe):.3f} ms/prompt ({len(encode)} batches of {BATCH}, "
          f"{args.num_seed} seed records, encoder precision {predictor.embedder.precision}, "
          f"torch threads {torch.get_num_threads()}, "
          f"{'packed' if predictor.embedder.packed else 'padded'} passes)")
    if other is not None:
        print(f"encoder with {'packed' if other.packed else 'padded'} passes on the same batches "
              f"{per(encode_other):.2f} ms/prompt: the path's own passes take "
              f"{np.median(encode) / np.median(encode_other):.2f}x its time")
    predictor.store.close()


if __name__ == "__main__":
    main()
