"""How well can any regressor on an encoder's vectors predict a data set's reply lengths from a
few hundred observed replies? A reference for the predictor's shift test (`lenserve predictor
eval --shift`): it fits off-the-shelf learners to ``--num-observe`` records and scores them on
``--num-test`` others, over ``--splits`` random splits, so that one split's figure can be read
against the spread between splits.

    python3 -m evaluation.predictor.ceiling --dataset-name alpaca \
        --dataset-path alpaca_data_1k_random_subset.json [--encoder DIR] [--splits 10]

Features: the prompt's vector (the stock MiniLM, or ``--encoder``), plus its log token count
and whether it has an input part (kNN uses the vector alone); target: log reply length in the
tokenizer's tokens. Median relative error and Kendall tau per learner: mean [min-max] over
splits. Also printed: the best rescaling of each learner's predictions chosen on the test part
itself (an optimistic bound on what a bias correction can still gain). ``--finetune-observed N``
first fine-tunes the encoder for N epochs on each split's observed replies (a served model's
own replies teaching the encoder), then fits the learners on its vectors.
"""
from __future__ import annotations

import argparse
import os
import tempfile

import numpy as np


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset-name", default="alpaca")
    ap.add_argument("--dataset-path", required=True)
    ap.add_argument("--encoder", help="encoder directory (default: the stock MiniLM)")
    ap.add_argument("--tokenizer", help="tokenizer that counts reply lengths (default: MiniLM's)")
    ap.add_argument("--num-observe", type=int, default=500)
    ap.add_argument("--num-test", type=int, default=500)
    ap.add_argument("--splits", type=int, default=10)
    ap.add_argument("--scale", type=float, default=1.0, help="reply lengths times this")
    ap.add_argument("--finetune-observed", type=int, default=0, metavar="EPOCHS",
                    help="fine-tune the encoder on each split's observed replies first")
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    from scipy.stats import kendalltau
    from sklearn.ensemble import HistGradientBoostingRegressor
    from sklearn.kernel_ridge import KernelRidge
    from sklearn.linear_model import Ridge
    from sklearn.neighbors import KNeighborsRegressor
    from sklearn.svm import SVR

    from evaluation.predictor.shift_eval import scaled
    from services.predictor import datasets
    from services.predictor.config import EmbedderConfig
    from services.predictor.embedder import Embedder
    from services.predictor.finetune import DEFAULT_WINDOW, fine_tune_encoder
    from services.predictor.proxy import ProxyConfig

    samples = datasets.load(args.dataset_name, args.dataset_path)
    if args.num_observe + args.num_test > len(samples):
        raise SystemExit(f"{len(samples)} records: fewer than --num-observe + --num-test")
    tokenizer = datasets.load_tokenizer(args.tokenizer)
    lengths = scaled(datasets.count_tokens(tokenizer, [s.reply for s in samples]), args.scale)
    prompts = [s.prompt for s in samples]
    prompt_len = np.log1p(datasets.count_tokens(tokenizer, prompts))
    has_input = np.array(["\n\n" in p for p in prompts], float)

    def embed(encoder):
        vectors = Embedder(EmbedderConfig(encoder_path=encoder)).encode(prompts)
        return vectors, np.hstack([vectors, prompt_len[:, None], has_input[:, None]])

    vectors, features = embed(args.encoder)
    y = np.log(lengths)
    learners = {
        "ridge": lambda: Ridge(3.0),
        "svr": lambda: SVR(C=1.0, epsilon=0.1),
        "kernel ridge": lambda: KernelRidge(alpha=0.3, kernel="rbf", gamma=0.5),
        "knn 10": lambda: KNeighborsRegressor(10, weights="distance"),
        "gradient boosting": lambda: HistGradientBoostingRegressor(
            max_iter=200, learning_rate=0.05, max_leaf_nodes=15),
    }
    scales = np.exp(np.linspace(-0.4, 0.2, 13))
    rows: dict[str, list[tuple[float, float, float]]] = {name: [] for name in learners}
    rows["global median"] = []
    for split in range(args.splits):
        order = np.random.default_rng(split).permutation(len(prompts))
        fit, test = order[:args.num_observe], order[args.num_observe:][:args.num_test]
        true = lengths[test]
        if args.finetune_observed:
            tuned = os.path.join(tempfile.mkdtemp(), "encoder")
            fine_tune_encoder([prompts[i] for i in fit], lengths[fit], tuned,
                              ProxyConfig(encoder_path=args.encoder, epochs=args.finetune_observed,
                                          max_seq_length=DEFAULT_WINDOW))
            vectors, features = embed(tuned)

        def score(pred, true=true):
            rel = lambda p: float(np.median(np.abs(p - true) / true))  # noqa: E731
            tau = kendalltau(pred, true).statistic if np.ptp(pred) > 0 else 0.0
            return rel(pred), float(tau), min(rel(pred * s) for s in scales)

        rows["global median"].append(score(np.full(len(test), np.exp(np.median(y[fit])))))
        logs = {}
        for name, make in learners.items():
            x = vectors if name.startswith("knn") else features
            logs[name] = make().fit(x[fit], y[fit]).predict(x[test])
            rows[name].append(score(np.exp(logs[name])))
        # The mean of their log predictions: errors that differ between learners cancel.
        rows.setdefault("mean of the five", []).append(
            score(np.exp(np.mean(list(logs.values()), axis=0))))
    encoder = args.encoder or "stock MiniLM"
    if args.finetune_observed:
        encoder += f" fine-tuned on the observed ({args.finetune_observed} epochs)"
    print(f"{args.dataset_name}: {args.num_observe} observed, {args.num_test} predicted, "
          f"{args.splits} splits, encoder {encoder}, lengths x{args.scale:g}")
    print("| learner | median RE | Kendall tau | median RE, best rescale (optimistic) |")
    print("| --- | --- | --- | --- |")
    for name, vals in rows.items():
        a = np.array(vals)
        cells = [f"{a[:, i].mean():.3f} [{a[:, i].min():.3f}-{a[:, i].max():.3f}]"
                 for i in range(3)]
        print(f"| {name} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
