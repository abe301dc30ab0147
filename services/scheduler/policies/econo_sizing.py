"""EconoServe's per-request estimates: how much KV to allocate (exact allocation of the
predicted length plus padding, or the predictor's calibrated upper quantile) and the SLO
deadline, ``SLO-scale x (tp + tg x l)`` with per-token prefill/decode times learned from the
executor's measured timings."""
from __future__ import annotations

import math
from dataclasses import dataclass

from services.scheduler.config import SchedulerConfig
from services.scheduler.policy import PolicyConfig
from services.scheduler.request import Request

_EMA = 0.1      # weight of a new timing sample: smooth, but follows a load change in ~10 steps


@dataclass(frozen=True)
class EconoServeConfig(PolicyConfig):
    padding_ratio: float = 0.15         # paper's sweet spot for ShareGPT (10-20%)
    use_upper_quantile: bool = False    # size KV by the predictor's upper quantile instead
    # Pad no further than the predictor's calibrated upper quantile: a predictor whose
    # errors are small needs less than padding_ratio (the oracle none). A prediction that
    # carries no calibration (source "given": a client's own figure) is padded in full.
    calibrated_padding: bool = True
    reserved_kv_fraction: float = 0.03  # of the pool, kept for prompt tasks (paper: 2-4%)
    # Of the pool: prompt KV of prefilled GTs still waiting for their allocation. That KV is
    # idle; at 0.1 it displaced decoding GTs (OPT-13B/A100 ShareGPT simulation at 3.5 req/s,
    # exact lengths: NL 0.11 s/token at 0.1, 0.03 at 0.02-0.03, 0.034 at 0.05): the reserve's
    # size keeps one reserve's worth of prefilled GTs ready to start.
    waiting_kv_fraction: float = 0.03
    enable_pipelining: bool = True
    lend_scope: str = "pool"            # "pool": any GT's unwritten tail; "host": halves of one
    buffer_ratio: float = 0.15          # pipelining safety buffer, of the hosting GT's remainder
    group_bucket_tokens: int = 16       # equal predicted remainder (to this bucket) = one group
    sync_groups: bool = True            # select GTs only when due (a GT ended, paused, fits)
    default_output_len: int = 128       # until a prediction arrives
    slo_scale: float = 2.0
    prefill_s_per_token: float = 0.0005  # initial tp; measured timings refine it
    decode_s_per_token: float = 0.02     # initial tg (one iteration per generated token)
    learn_timings: bool = True
    deadline_range_s: float = 0.5       # ordering ranges (paper §3.4)
    kv_range_blocks: int = 8
    length_range_tokens: int = 128


def validate(cfg: EconoServeConfig, sched: SchedulerConfig) -> int:
    """Refuse options that cannot work; returns the number of reserved blocks."""
    checks = [
        (0.0 <= cfg.reserved_kv_fraction < 1.0, "reserved_kv_fraction must be in [0, 1)"),
        (0.0 < cfg.waiting_kv_fraction <= 1.0, "waiting_kv_fraction must be in (0, 1]"),
        (cfg.padding_ratio >= 0.0, "padding_ratio must be >= 0"),
        (cfg.lend_scope in ("pool", "host"), "lend_scope must be pool or host"),
        (0.0 <= cfg.buffer_ratio < 0.5, "buffer_ratio must be in [0, 0.5)"),
        (cfg.slo_scale > 0.0, "slo_scale must be > 0"),
        (min(cfg.group_bucket_tokens, cfg.default_output_len, cfg.kv_range_blocks,
             cfg.length_range_tokens) >= 1, "bucket, range and default lengths must be >= 1"),
        (cfg.deadline_range_s > 0.0, "deadline_range_s must be > 0"),
        (min(cfg.prefill_s_per_token, cfg.decode_s_per_token) >= 0.0, "times must be >= 0"),
    ]
    for ok, why in checks:
        if not ok:
            raise ValueError(f"econoserve: {why}")
    reserved = math.ceil(cfg.reserved_kv_fraction * sched.num_gpu_blocks)
    if reserved >= sched.num_gpu_blocks:
        raise ValueError(f"econoserve: reserving {reserved} of {sched.num_gpu_blocks} KV blocks "
                         "leaves none for generation tasks")
    return reserved


class LengthModel:
    def __init__(self, cfg: EconoServeConfig, sched: SchedulerConfig, reserved_blocks: int):
        self.cfg = cfg
        self.sched = sched
        # A GT's allocation must fit the unreserved pool, or it could never be activated.
        self.max_gt_tokens = (sched.num_gpu_blocks - reserved_blocks) * sched.block_size
        self.tp = cfg.prefill_s_per_token
        self.tg = cfg.decode_s_per_token

    def predicted_output_len(self, req: Request) -> int:
        pred, cfg = req.prediction, self.cfg
        if pred is None:
            return cfg.default_output_len
        if cfg.use_upper_quantile:
            return max(pred.upper_quantile, pred.length, 1)
        padded = math.ceil(pred.length * (1.0 + cfg.padding_ratio))
        if cfg.calibrated_padding and pred.source != "given":
            padded = min(padded, pred.upper_quantile)
        return max(padded, pred.length, 1)

    def output_len(self, req: Request) -> int:
        """Output tokens to allocate for. Once a request has outgrown its prediction the
        prediction is evidently wrong; doubling what it has produced bounds the number of
        re-allocations even when the prediction is 100x too small."""
        predicted = self.predicted_output_len(req)
        done = req.num_output_tokens
        return predicted if done < predicted else 2 * done

    def target_tokens(self, req: Request) -> int:
        """Total KV tokens (prompt + output) of the request's exact allocation."""
        cap = min(req.num_prompt_tokens + req.sampling_params.max_tokens,
                  self.sched.max_model_len, max(self.max_gt_tokens, req.num_tokens + 1))
        want = req.num_prompt_tokens + self.output_len(req)
        return max(min(want, cap), min(req.num_tokens + 1, self.sched.max_model_len))

    def remaining(self, req: Request) -> int:
        return max(self.target_tokens(req) - req.num_tokens, 1)

    def deadline(self, req: Request) -> float:
        """Absolute JCT deadline. ``slo_deadline_s`` is the request's own SLO (seconds after
        arrival); otherwise the paper's SLO-scale x (prefill time + decode time)."""
        slo = req.slo_deadline_s
        if slo is None:
            slo = self.cfg.slo_scale * (self.tp * req.num_prompt_tokens
                                        + self.tg * self.predicted_output_len(req))
        return req.metrics.arrival_time + slo

    def observe(self, num_tokens: int, num_decodes: int, iteration_s: float) -> None:
        """Fold one iteration's measured time into tp (per batched token) and tg (per
        iteration that produced decode tokens)."""
        if not self.cfg.learn_timings or iteration_s <= 0.0 or num_tokens <= 0:
            return
        self.tp += _EMA * (iteration_s / num_tokens - self.tp)
        if num_decodes:
            self.tg += _EMA * (iteration_s - self.tg)
