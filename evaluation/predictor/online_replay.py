"""Replay a simulated run's requests through the embedded predictor as the simulator feeds it:
predict each request when it arrives, observe it when it finishes (the run's own times), and
print the rank correlation of predicted and real lengths per window of arrivals.

    python3 -m evaluation.predictor.online_replay \
        --run results/raw/alise_paper/sharegpt_opt-13b_alise.json \
        --db results/raw/alise_paper/sharegpt_predictor_db --model opt-13b --rate 0.5 \
        [--no-observe] [--set observed_parity=25 --set probation_records=0 ...]

Retrains run inline (deterministic), where the simulator runs them in a thread beside the
simulation; a window's figure moves by about 1/sqrt(its size) from chance alone.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import time

import numpy as np
from scipy.stats import spearmanr

from lenserve.workloads.datasets import load_samples
from lenserve.workloads.sampling import SampleConfig, sample_requests
from services.executor.factory import load_tokenizer
from services.predictor.local import build_from_db
from services.predictor.types import Completion

WINDOWS = ((0, 50), (50, 150), (150, 300), (300, 600))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--run", required=True, help="a `lenserve simulate --result-json` file")
    p.add_argument("--db", required=True, help="a DB `lenserve predictor build` wrote")
    p.add_argument("--model", required=True)
    p.add_argument("--rate", type=float, required=True, help="which run of the sweep")
    p.add_argument("--no-observe", action="store_true", help="predict only: the seed alone")
    p.add_argument("--set", action="append", default=[], metavar="FIELD=JSON",
                   help="a PredictorConfig field for the replay (repeatable)")
    args = p.parse_args()
    result = json.load(open(args.run))
    config, run = result["config"], [r for r in result["runs"]
                                       if r["request_rate"] == args.rate][0]
    chosen = sample_requests(
        load_samples(config["dataset_name"], config["dataset_path"]),
        SampleConfig(num_prompts=config["num_prompts"], seed=config["seed"],
                     max_prompt_len=config["max_prompt_len"],
                     max_total_len=config["max_model_len"]),
        load_tokenizer(config["model"]))
    prompts = {r.request_id: s.prompt for r, s in chosen}
    reqs = {r["request_id"]: r for r in run["requests"]}
    events = sorted([(r["arrival_time"], 0, k) for k, r in reqs.items()]
                    + [(r["finish_time"], 1, k) for k, r in reqs.items()])
    predictor = build_from_db(args.model, args.db)
    core = predictor.core
    core.retrain_hook = None
    over = {k: json.loads(v) for k, v in (s.split("=", 1) for s in args.set)}
    core.config = dataclasses.replace(core.config, **over)
    predicted, t0 = {}, time.perf_counter()
    try:
        for t, kind, k in events:
            if kind == 0:
                predicted[k] = core.predict([prompts[k]], args.model)[0].length
            elif not args.no_observe:
                core.observe([Completion(args.model, prompts[k], reqs[k]["output_len"], k,
                                         finished_at=t)])
    finally:
        predictor.close()
    order = sorted(reqs, key=lambda k: reqs[k]["arrival_time"])
    pred = np.array([predicted[k] for k in order], float)
    real = np.array([reqs[k]["output_len"] for k in order], float)
    cells = " ".join(f"{a}-{b}: {spearmanr(pred[a:b], real[a:b])[0]:.2f}" for a, b in WINDOWS
                     if b <= len(order))
    print(f"{over or 'defaults'}{' (no observe)' if args.no_observe else ''} @ {args.rate:g} "
          f"req/s: Spearman all {spearmanr(pred, real)[0]:.3f}; {cells}; "
          f"{dict(core.stats)}; {time.perf_counter() - t0:.0f}s")


if __name__ == "__main__":
    main()
