"""Sampling parameters, with vLLM's names and defaults."""
from __future__ import annotations

from dataclasses import dataclass, field

from lenserve_contract.errors import InvalidRequestError

__all__ = ["InvalidRequestError", "SamplingParams"]


@dataclass
class SamplingParams:
    temperature: float = 1.0
    top_k: int = -1
    top_p: float = 1.0
    seed: int | None = None
    max_tokens: int = 16
    min_tokens: int = 0
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    # False: token ids only, no text (vLLM's name); benchmarks that count tokens skip the
    # per-token detokenizing cost. Stop strings need text, so they need it on.
    detokenize: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.verify()

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def verify(self) -> None:
        """Raise InvalidRequestError naming the first bad parameter."""
        # The executor verifies every sequence of every iteration: the common case builds no
        # messages.
        if (self.temperature >= 0.0 and (self.top_k == -1 or self.top_k >= 0)
                and 0.0 < self.top_p <= 1.0 and 0 <= self.min_tokens <= self.max_tokens
                and self.max_tokens >= 1 and all(isinstance(s, str) and s for s in self.stop)
                and (self.detokenize or not self.stop)):
            return
        checks = [
            (self.temperature >= 0.0, "temperature", f"must be >= 0, got {self.temperature}"),
            (self.top_k == -1 or self.top_k >= 0, "top_k", f"must be -1 (off) or >= 0, got {self.top_k}"),
            (0.0 < self.top_p <= 1.0, "top_p", f"must be in (0, 1], got {self.top_p}"),
            (self.max_tokens >= 1, "max_tokens", f"must be >= 1, got {self.max_tokens}"),
            (0 <= self.min_tokens <= self.max_tokens, "min_tokens",
             f"must be in [0, max_tokens], got {self.min_tokens}"),
            (all(isinstance(s, str) and s for s in self.stop), "stop", "stop strings must be non-empty"),
            (self.detokenize or not self.stop, "stop", "stop strings need detokenize=True"),
        ]
        for ok, name, why in checks:
            if not ok:
                raise InvalidRequestError(f"invalid sampling parameter {name}: {why}", field=name)
