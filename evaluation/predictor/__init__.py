"""The predictor's offline evaluation (``lenserve predictor eval``) and studies of the
predictor: accuracy against baselines, the shift test, the cost of each path of a
prediction, the seed files a benchmark can use without leaking its answers."""
