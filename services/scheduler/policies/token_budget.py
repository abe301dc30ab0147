"""The token budget that saturates the token-wise layers (FluidInfer, report §4.1).

The report sizes an iteration by compute, not by device KV: "the number of concatenated tokens
should saturate GPU compute" (at least 512 tokens for OPT-6.7B on four RTX 4090s). Below that
point an iteration pays a fixed cost (reading every weight once, launches, the loop) that more
tokens would share; above it, each further token costs as much as the last and only lengthens
the iteration (every request's next token waits for it).

``saturation_tokens`` finds that point on a curve of the token-wise layers' seconds for ``n``
decode tokens (no attention): the smallest ``n`` whose seconds per token are within
``tolerance`` of the least seconds per token up to the largest batch the engine allows. The curve comes
from the executor's cost model where it has one (the simulator: the measured profile or the
roofline, ``state.token_seconds``), else from the execution-time model fitted online to the
measured iterations (``TokenCurve``): ``c + beta * n``, whose fixed part ``c`` the tokens share.
"""
from __future__ import annotations

from collections.abc import Callable

from services.scheduler.policies.time_model import ExecutionTimeModel


def saturation_tokens(seconds_of: Callable[[int], float], max_tokens: int,
                      tolerance: float = 0.25) -> int:
    """Smallest ``n`` in ``[1, max_tokens]`` whose seconds per token are at most ``1 +
    tolerance`` times the least seconds per token over the range (found on the powers of two
    and ``max_tokens``; a measured curve may rise again past its best point, where a large
    batch spills caches). Per-token time falls up to that point as the fixed cost is shared,
    so a binary search below it finds the budget."""
    if max_tokens < 1 or tolerance < 0:
        raise ValueError(f"max_tokens must be >= 1 and tolerance >= 0, got {max_tokens} and "
                         f"{tolerance}")
    grid = sorted({1 << k for k in range(max_tokens.bit_length()) if 1 << k <= max_tokens}
                  | {max_tokens})
    best = min(grid, key=lambda n: seconds_of(n) / n)
    limit = (1.0 + tolerance) * seconds_of(best) / best
    lo, hi = 1, best
    while lo < hi:
        mid = (lo + hi) // 2
        if seconds_of(mid) / mid <= limit:
            hi = mid
        else:
            lo = mid + 1
    return lo


class TokenCurve:
    """The token-wise seconds of ``n`` decode tokens from an execution-time model fitted online
    (``time_model.py``): ``c + beta * n``, attention's context term left out. None until the
    model is fitted."""

    def __init__(self, model: ExecutionTimeModel | None = None):
        self.model = model if model is not None else ExecutionTimeModel()

    def __call__(self, n: int) -> float:
        _, _, beta, c = self.model.coefficients
        return c + beta * n

    @property
    def ready(self) -> bool:
        coef = self.model.coefficients
        return coef is not None and coef[2] > 0


class TokenBudget:
    """The policy's token budget per iteration: ``auto`` derives it from the token-wise cost
    curve (the executor's, else the online fit; the configured ``max_num_batched_tokens``
    until either exists), an integer sets it by hand. Never above the configured maximum,
    which bounds the executor's activations."""

    def __init__(self, setting: str, tolerance: float):
        text = str(setting).strip().lower()
        if text != "auto" and not (text.isdigit() and int(text) > 0):
            raise ValueError(f"token_budget must be auto or a positive integer, got {setting!r}")
        if tolerance <= 0:
            raise ValueError(f"saturation_tolerance must be > 0, got {tolerance}")
        self.fixed = None if text == "auto" else int(text)
        self.tolerance = tolerance
        self.curve = TokenCurve()
        self._cache: tuple[object, int, int] | None = None   # (curve key, max, budget)
        self.source = "configured"

    def observe(self, output, result) -> None:
        """Feed one executed iteration to the online fit."""
        self.curve.model.observe_iteration(output, result)

    def tokens(self, state, configured: int) -> int:
        if self.fixed is not None:
            self.source = "set"
            return min(self.fixed, configured)
        curve = getattr(state, "token_seconds", None)
        if curve is not None:
            key, self.source = curve, "cost model"
        elif self.curve.ready:
            curve, key, self.source = self.curve, self.curve.model.coefficients, "online fit"
        else:
            self.source = "configured"
            return configured
        if self._cache is None or self._cache[:2] != (key, configured):
            self._cache = (key, configured,
                           saturation_tokens(curve, configured, self.tolerance))
        return self._cache[2]
