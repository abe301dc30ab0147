"""Research and evaluation tools: studies, experiments and the predictor's offline eval.

Nothing deployed depends on this package. It sits above the serving code (it may import
``lenserve``, ``services``, ``gateway``), and only ``lenserve predictor eval`` imports it, when
that command runs, so that an install without it still serves."""
