"""ALISE's execution-time model (Eq. 3-5), fitted online from measured iteration times.

    T_gen(s, n) = T_pre(s) + T_dec(s, n),   T_pre(s) ~ s * T0,   T_dec(s, n) ~ n * (alpha*s + beta)

One iteration runs many requests at once, so each measured iteration time is modelled as the
sum of its parts plus a fixed per-iteration overhead c (kernel launches, sampling):

    total_s ~ T0 * prefill_tokens + alpha * sum(s of decodes) + beta * num_decodes + c

Least squares over a 4x4 normal-equation accumulator, with exponential forgetting so the fit
follows a changing machine: each observation is O(1), a solve is a 4x4 system and happens at
most every ``refit_every`` observations. The intercept c keeps fixed overhead from being
misread as per-token cost. A request's remaining *time* still pays c on every decode step
(each step is a whole iteration), so estimates charge a decode step beta + c: Eq. 3-5's beta is
the per-step time of the job run alone, which includes that overhead. Leaving c out ranked
requests by their marginal share of a batch, a few hundredths of the wall time when the
iteration is bound by reading the weights (c dominates), and virtual aging, in seconds per
second waited, then outweighed every length difference within a second of queueing.
Until enough iterations were measured (or when the executor reports no timings), estimates
are token counts scaled by ``nominal_token_s``.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from services.scheduler.output import SchedulerOutput

if TYPE_CHECKING:
    from services.executor.types import ExecutorOutput

_RIDGE = 1e-12      # keeps the solve defined while some feature never varied


class ExecutionTimeModel:
    def __init__(self, nominal_token_s: float = 0.02, min_samples: int = 32,
                 refit_every: int = 16, forget: float = 0.999):
        # Prior: a decode step costs nominal_token_s; a prompt token a 32nd of that.
        self.prior = (nominal_token_s / 32, 0.0, nominal_token_s)
        self.min_samples, self.refit_every, self.forget = min_samples, refit_every, forget
        self._xtx = np.zeros((4, 4))
        self._xty = np.zeros(4)
        self.num_samples = 0
        self._fit: tuple[float, float, float, float] | None = None   # (T0, alpha, beta, c)
        # What estimates use: (T0, alpha, beta + c, c).
        self._coef: tuple[float, float, float, float] | None = None

    @property
    def fitted(self) -> bool:
        return self._coef is not None

    @property
    def coefficients(self) -> tuple[float, float, float, float] | None:
        """(T0, alpha, beta, c) once fitted, else None."""
        return self._fit

    def observe(self, prefill_tokens: int, decode_prompt_sum: int, num_decodes: int,
                seconds: float) -> None:
        x = np.array([prefill_tokens, decode_prompt_sum, num_decodes, 1.0])
        self._xtx = self.forget * self._xtx + np.outer(x, x)
        self._xty = self.forget * self._xty + seconds * x
        self.num_samples += 1
        n = self.num_samples
        if n >= self.min_samples and (self._coef is None or n % self.refit_every == 0):
            self._solve()

    def observe_iteration(self, output: SchedulerOutput, result: ExecutorOutput | None) -> None:
        """Feed one executed iteration; ignored when the executor measured nothing."""
        timings = None if result is None else result.timings
        seconds = 0.0 if timings is None else (timings.total_s or timings.forward_s)
        if seconds <= 0 or not output.scheduled:
            return
        prefill = decode_sum = decodes = 0
        for request, n in output.scheduled:
            # A one-token step of a request that already has output is a decode.
            if n == 1 and len(request.token_ids) - request.num_prompt_tokens > 1:
                decode_sum += request.num_prompt_tokens
                decodes += 1
            else:
                prefill += n
        self.observe(prefill, decode_sum, decodes, seconds)

    def _solve(self) -> None:
        a = self._xtx + _RIDGE * np.trace(self._xtx) * np.eye(4)
        try:
            coef = np.linalg.solve(a, self._xty)
        except np.linalg.LinAlgError:
            return
        # Noise can push a coefficient below zero; negative cost would invert the ranking.
        t0, alpha, beta, c = (max(0.0, float(v)) for v in coef)
        if t0 > 0 or beta > 0 or alpha > 0:
            self._fit = (t0, alpha, beta, c)
            self._coef = (t0, alpha, beta + c, c)

    def rates(self) -> tuple[float, float, float]:
        """(T0, alpha, beta) that ``estimate`` uses now: fitted, or the prior."""
        return self._coef[:3] if self._coef is not None else self.prior

    def estimate(self, prefill_tokens: int, prompt_len: int, decode_tokens: int) -> float:
        """Seconds for ``prefill_tokens`` still to prefill and ``decode_tokens`` decode steps
        of a request with a ``prompt_len``-token prompt (Eq. 3-5), a decode step at beta + c."""
        t0, alpha, beta = self._coef[:3] if self._coef is not None else self.prior
        return prefill_tokens * t0 + decode_tokens * (alpha * prompt_len + beta)
