"""How long a prediction waits behind the predictor's learning, in the serving loop's pump.

    python3 -m evaluation.predictor.prediction_wait --predictor embedded:DIR --prompts FILE \\
        [--inline-retrain]

Reports ``--completions`` finished requests (prompts from FILE, ShareGPT first turns, one JSON
record per line; enough to trigger an MLP retrain) to a ``PredictionPump``, then asks for ten
predictions one after another and prints how long each took to come back. With
``--inline-retrain`` the retrain runs on the pump's own thread, as the embedded predictor did
before retrains got a thread of their own.
"""
from __future__ import annotations

import argparse
import gzip
import itertools
import json
import time

from services.predictor.interface import PredictQuery
from services.predictor.local import make_predictor
from services.predictor.types import Completion
from services.scheduler.predictions import PredictionPump


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--predictor", default="embedded")
    p.add_argument("--model", default="opt-125m")
    p.add_argument("--prompts", required=True)
    p.add_argument("--completions", type=int, default=60)
    p.add_argument("--inline-retrain", action="store_true")
    args = p.parse_args()
    opener = gzip.open if args.prompts.endswith(".gz") else open
    with opener(args.prompts, "rt", encoding="utf-8") as f:
        prompts = [json.loads(line)["prompt"]
                   for line in itertools.islice(f, args.completions + 10)]
    predictor = make_predictor(args.predictor, args.model)
    if args.inline_retrain:
        predictor.core.retrain_hook = None
    pump = PredictionPump(predictor, args.model)
    for i, prompt in enumerate(prompts[:args.completions]):
        pump.report(Completion(args.model, prompt, 50 + i, str(i), float(i)))
    time.sleep(0.5)
    waits = []
    for prompt in prompts[args.completions:]:
        start = time.perf_counter()
        pump.submit("q", PredictQuery(prompt, 256))
        while not pump.drain():
            time.sleep(0.001)
        waits.append(time.perf_counter() - start)
    print("prediction waits (s):", " ".join(f"{w:.3f}" for w in waits),
          f"(retrains started: {predictor.core.stats['retrains']})")
    pump.close()


if __name__ == "__main__":
    main()
