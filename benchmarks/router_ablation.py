"""Which terms of ``length-aware``'s score matter: variants of the router's score side by side
in the simulator's cluster mode (A100-80GB replicas, Llama-2-7B, ShareGPT, a 1,536-block pool
each, predictions with log-normal error sigma 0.7, as ``router_simulated``).

    python3 benchmarks/router_ablation.py [--replicas 8] [--inner vllm] [--rates 76,80]
        [--seed 0] [--error-seed SEED] [--num-prompts 3000] [--variants NAME,...]

Prints P99 TTFT, normalized latency and preemptions per variant and rate (no page section:
the variants are experiments, registered for this process only). Virtual time.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import sys
import tempfile
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import router_simulated, runs  # noqa: E402
from services.router import policies  # noqa: E402
from services.router.policies import projected_kv_share, step_time_s  # noqa: E402


def _no_since_count(r) -> int:
    return len(r.placed) if r.load is None else \
        r.load.stats.num_waiting + r.load.stats.num_running


def _pool_now(r, p) -> float:
    """The pool's fill now plus the prompts queued (reported and placed since)."""
    prefill, _ = r.pending_tokens()
    return (r.kv_tokens_used() + prefill + p.prompt_tokens) / r.kv_capacity_tokens()


def _pool_now_no_since(r, p) -> float:
    queued = r.load.queued_prefill_tokens if r.load is not None else 0
    return (r.kv_tokens_used() + queued) / r.kv_capacity_tokens()


def _remaining_work(r, p) -> float:
    prefill, decode = r.pending_tokens()
    return decode + prefill


def _plus_count(tokens_per_request: int):
    return lambda r, p: projected_kv_share(r, p) + \
        tokens_per_request * r.num_requests() / r.kv_capacity_tokens()


def _remaining(r) -> list[int]:
    """The predicted remaining outputs of the router's unfinished placements on ``r``."""
    return [max(p.predicted_output_len - p.num_output_tokens, 1) for p in r.placed.values()]


def _work_ahead(r, p) -> float:
    """Shortest-remaining-first inside the replica (``alise``): the predicted work ranked
    ahead of the request, plus its own length once per request it would go ahead of."""
    n = p.predicted_output_len
    rest = _remaining(r)
    return sum(x for x in rest if x <= n) + n * sum(1 for x in rest if x > n)


def _nl_cost(r, p) -> float:
    """The same, normalized: the request's wait over its own length, plus its length over
    the length of each request it would delay (the mean normalized latency it adds)."""
    n = p.predicted_output_len
    rest = _remaining(r)
    return sum(x for x in rest if x <= n) / n + sum(n / x for x in rest if x > n)


class _Band(policies.LengthAware):
    """``length-aware``'s band, then another key in place of the step time."""
    key = staticmethod(lambda r, p: 0.0)

    def within_band(self, replica, placement, share):
        return self.key(replica, placement)


class _BandAll(policies.LengthAware):
    """The band over every replica, a preempting one (``alise`` inside) too."""

    def always_within(self, replica):
        return False


class _RankedShare(_BandAll):
    """The band over every replica, a preempting replica's share counting only the KV of the
    requests predicted to end first (those the new one cannot preempt) and the new prompt."""

    def score(self, replica, placement):
        n, held = placement.predicted_output_len, 0
        for p in replica.placed.values():
            rest = max(p.predicted_output_len - p.num_output_tokens, 1)
            if rest <= n or not replica.preempts_by_length():
                held += p.prompt_tokens + p.num_output_tokens + min(self.horizon_steps, rest)
        return (held + placement.prompt_tokens) / replica.kv_capacity_tokens()


class _StepKey:
    """Within the band, the decode step of the batch the request joins (no resident term)."""

    def within_band(self, replica, placement, share):
        return step_time_s(replica, share)


class _OwnHorizon(policies.LengthAware):
    """``length-aware`` with the horizon of the request's own predicted length (8-64 steps)."""

    def choose(self, replicas, placement):
        self.horizon_steps = min(max(placement.predicted_output_len, 8), 64)
        return super().choose(replicas, placement)


class _FullCount(policies.LengthAware):
    """``length-aware`` until every pool is projected full, then the fewest requests."""

    def choose(self, replicas, placement):
        shares = [projected_kv_share(r, placement, self.horizon_steps) for r in replicas]
        if min(shares) < 1.0:
            return super().choose(replicas, placement)
        turn = self._rotation(replicas)
        return min(replicas, key=lambda r: (r.num_requests(), turn(r)))


CHOOSERS = {
    "full-count": _FullCount,
    "band-count": type("BandCount", (_Band,), {"key": staticmethod(lambda r, p: r.num_requests())}),
    "band-ahead": type("BandAhead", (_Band,), {"key": staticmethod(_work_ahead)}),
    "band-nl-cost": type("BandNl", (_Band,), {"key": staticmethod(_nl_cost)}),
    "own-horizon": _OwnHorizon,
    "band-step": type("BandStep", (_StepKey, policies.LengthAware), {}),
    "band-all": _BandAll,
    "band-all-step": type("BandAllStep", (_StepKey, _BandAll), {}),
    "ranked-share": _RankedShare,
}

VARIANTS = {
    "share-only": projected_kv_share,       # the projected share alone, no time-model stage
    "count-no-since": lambda r, p: _no_since_count(r),      # least-loaded, blind between reports
    "pool-now": _pool_now,                                  # horizon 0
    "pool-now-no-since": _pool_now_no_since,
    "remaining-work": _remaining_work,                      # predicted decode + queued prefill
    "horizon-32": lambda r, p: projected_kv_share(r, p, 32),
    "horizon-64": lambda r, p: projected_kv_share(r, p, 64),
    "plus-count-128": _plus_count(128),
    "plus-count-256": _plus_count(256),
    "work-ahead": _work_ahead,
    "nl-cost": _nl_cost,
}


def register() -> None:
    for name, fn in VARIANTS.items():
        policies.POLICIES[name] = type(f"Variant_{name}", (policies.RouterPolicy,), {
            "name": name, "needs_prediction": True, "score": lambda self, r, p, fn=fn: fn(r, p)})
    for name, cls in CHOOSERS.items():
        policies.POLICIES[name] = type(f"Variant_{cls.__name__}", (cls,), {"name": name})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--replicas", type=int, default=8)
    ap.add_argument("--inner", default="vllm")
    ap.add_argument("--rates", default="76,80")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--error-seed", type=int, default=None,
                    help="the prediction errors' seed (default: --seed)")
    ap.add_argument("--num-prompts", type=int, default=3000)
    ap.add_argument("--variants",
                    default=",".join(["least-loaded", "length-aware", *VARIANTS, *CHOOSERS]))
    ap.add_argument("--dataset-path", default=str(runs.SHAREGPT))
    args = ap.parse_args(argv)
    register()
    from lenserve.cli import main as lenserve_main
    with tempfile.TemporaryDirectory() as tmp:
        result = Path(tmp) / "ablation.json"
        cmd = router_simulated.simulate_args(
            args.replicas, args.num_prompts, [float(r) for r in args.rates.split(",")],
            Path(args.dataset_path), result, routers=args.variants.split(","),
            inner=(args.inner,), seed=args.seed)
        if args.error_seed is not None:
            cmd[cmd.index("--predictor") + 1] = f"{router_simulated.PREDICTOR}:{args.error_seed}"
        with contextlib.redirect_stdout(io.StringIO()):
            lenserve_main(cmd)
        found = json.loads(result.read_text())["runs"]
    print("| router | rate (req/s) | P99 TTFT (s) | NL (s/token) | preemptions |")
    print("| --- | --- | --- | --- | --- |")
    for run in found:
        s = run["summary"]
        nl = s["normalized_latency_s_per_token"] if not s["failed"] else math.inf
        print(f"| {run['backend'].split('/', 1)[1]} | {run['request_rate']:g} | "
              f"{s['ttft_ms']['p99'] / 1000:.2f} | {nl:.4f} | {s.get('num_preemptions', '?')} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
