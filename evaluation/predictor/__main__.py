"""``python -m evaluation.predictor``: ``lenserve predictor eval`` with the same flags."""
import sys

from evaluation.predictor.eval_cli import main

if __name__ == "__main__":
    sys.exit(main())
