"""The length-predictor interface the serving loop calls. The embedded predictor, the gRPC
client and the oracle implement it; every failure comes back as a ``default`` prediction with
its reason, never as an exception into the serving loop."""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

from services.predictor.types import Completion, Prediction


@dataclass(frozen=True)
class PredictQuery:
    prompt: str
    max_tokens: int
    # The real output length when the caller knows it (benchmarks force lengths): only the
    # oracle reads it.
    true_output_len: int | None = None


class LengthPredictor(ABC):
    name: str = "abstract"
    # Cheap predictors answer inline at submission; others run off the serving loop.
    inline: bool = False

    @abstractmethod
    def predict(self, queries: Sequence[PredictQuery], model: str) -> list[Prediction]:
        """One prediction per query, in order."""

    @abstractmethod
    def observe(self, completions: Sequence[Completion]) -> None:
        """Learn from finished requests (ALISE's DB.update)."""

    def close(self) -> None:
        """Release connections and threads."""
