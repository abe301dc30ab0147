"""Seed files for a predictor that a benchmark can be run against without leaking its answers.

    python3 -m evaluation.predictor.holdout_seed --dataset-path sharegpt_v3_first_turn.jsonl.gz \
        --num-prompts 60 --seed 0 --max-model-len 256 --model opt-125m --out DIR

Picks the prompts ``lenserve bench`` samples with the same ``--dataset-name``,
``--dataset-path``, ``--num-prompts``, ``--seed`` and ``--max-model-len`` (ShareGPT first turns
or Alpaca records), and writes two files of the remaining records, one ``{"prompt", "response"}``
JSON record per line whatever the dataset, for ``lenserve predictor build --dataset-name
sharegpt``:

* ``DIR/others.jsonl.gz``: every record whose prompt is not one of the benchmark's;
* ``DIR/others_fit.jsonl.gz``: those of them whose prompt and reply fit ``--max-model-len``
  tokens of ``--model``'s tokenizer (each side at least 4 tokens): the replies a server with
  that context limit produces, and the only ones a benchmark with it samples.

It also saves the model's tokenizer to ``DIR/tokenizer`` (``build --tokenizer``), so that the
DB counts reply lengths in the tokens the engine generates.
"""
from __future__ import annotations

import argparse
import gzip
import json
from pathlib import Path

from lenserve.workloads.datasets import load_samples
from lenserve.workloads.sampling import SampleConfig, sample_requests
from services.executor.factory import load_tokenizer


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset-name", choices=("sharegpt", "alpaca"), default="sharegpt")
    p.add_argument("--dataset-path", required=True)
    p.add_argument("--num-prompts", type=int, required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--model", default="opt-125m")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = load_tokenizer(args.model)
    tokenizer.save_pretrained(out / "tokenizer")
    samples = load_samples(args.dataset_name, args.dataset_path)
    chosen = sample_requests(samples, SampleConfig(num_prompts=args.num_prompts, seed=args.seed,
                                                   max_total_len=args.max_model_len), tokenizer)
    held_out = {sample.prompt for _, sample in chosen}
    records = [{"prompt": s.prompt, "response": s.reference}
               for s in samples if s.prompt not in held_out]
    prompts = tokenizer([r["prompt"] for r in records], add_special_tokens=False)["input_ids"]
    replies = tokenizer([r["response"] for r in records], add_special_tokens=False)["input_ids"]
    fit = [r for r, a, b in zip(records, prompts, replies)
           if len(a) >= 4 and len(b) >= 4 and len(a) + len(b) <= args.max_model_len]
    for name, rows in (("others", records), ("others_fit", fit)):
        with gzip.open(out / f"{name}.jsonl.gz", "wt", encoding="utf-8") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
    print(f"{len(held_out)} benchmark prompts held out; {len(records)} other records, "
          f"{len(fit)} of them within {args.max_model_len} tokens, in {out}")


if __name__ == "__main__":
    main()
