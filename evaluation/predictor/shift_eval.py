"""`lenserve predictor eval --shift NAME`: seeded from one model's replies, serving another.

The predictor is built from the seed data set as `build` would (DB, MLP, calibration), then
observes the served model's real replies to some prompts of the shift data set, through
`Predictor.observe` with retraining as in service, and predicts the other prompts. Rows:
cold (before observing), after each checkpoint of observed completions, and, for reference,
ALISE built on the observed completions alone (what a predictor without seed data does).
"""
from __future__ import annotations

import dataclasses
import logging
import time

import numpy as np

from evaluation.predictor.eval_vectors import VectorReuse
from evaluation.predictor.evaluate import EVAL_MODEL, EvalData, Row, build_predictor
from services.predictor.config import PredictorConfig
from services.predictor.core import Predictor
from services.predictor.types import Completion

log = logging.getLogger(__name__)
BATCH = 32


@dataclasses.dataclass(frozen=True)
class ShiftData:
    seed: EvalData  # train part: the seed data set; test part: the served model's test prompts
    observe_prompts: list[str]
    observe_lengths: np.ndarray


def scaled(lengths, scale: float) -> np.ndarray:
    """The served model's lengths: the data set's replies times `scale` (2: a verbose model)."""
    return np.maximum(1, np.round(np.asarray(lengths, float) * scale)).astype(int)


def run(data: ShiftData, config: PredictorConfig, metric, checkpoints=(100,),
        suffix: str = "", vectors: VectorReuse | None = None) -> list[Row]:
    """Cold, after each checkpoint and after all observed completions, observed-only."""
    predictor = build_predictor(data.seed, config, vectors=vectors)
    # Built without automatic retraining; served, it retrains as observations arrive.
    predictor.config = dataclasses.replace(predictor.config,
                                           retrain_every=config.retrain_every or 1000)
    test = data.seed.test_prompts
    rows = [_row(predictor, test, metric, f"cold (seed only){suffix}")]
    done = 0
    for stop in sorted({c for c in checkpoints if c < len(data.observe_prompts)}
                       | {len(data.observe_prompts)}):
        t0 = time.perf_counter()
        observe_in_batches(predictor, data.observe_prompts[done:stop],
                           data.observe_lengths[done:stop], start=done)
        log.info("observed %d completions (%.0fs with retraining)", stop,
                 time.perf_counter() - t0)
        done = stop
        rows.append(_row(predictor, test, metric, f"after {stop} observed{suffix}",
                         _state_note(predictor)))
    timing = _timing(predictor, test, data.seed.test_lengths)
    rows[-1] = dataclasses.replace(rows[-1], **{**timing,
                                                "note": f"{rows[-1].note}; {timing['note']}"})
    predictor.store.close()
    rows.append(_observed_only(data, config, metric, suffix, vectors))
    return rows


def observe_in_batches(predictor: Predictor, prompts, lengths, start: int = 0) -> None:
    """Served replies, BATCH at a time, with ids obs-<start + i> and ascending finish times."""
    for i in range(0, len(prompts), BATCH):
        recs = [Completion(EVAL_MODEL, p, int(n), f"obs-{start + i + j}",
                           finished_at=float(start + i + j + 1))
                for j, (p, n) in enumerate(zip(prompts[i:i + BATCH], lengths[i:i + BATCH]))]
        result = predictor.observe(recs)
        if result.rejected:
            log.warning("%d completions refused: %s", result.rejected, result.errors[:3])


def _row(predictor: Predictor, prompts: list[str], metric, name: str, note: str = "") -> Row:
    preds = predictor.predict(prompts, EVAL_MODEL)
    return Row(name, metric([p.length for p in preds], [p.upper_quantile for p in preds]),
               note=note)


def _state_note(predictor: Predictor) -> str:
    state = predictor.learning_state(EVAL_MODEL)
    return (f"seed shift mlp {state['seed_shift']['mlp']:+.2f} retrieval "
            f"{state['seed_shift']['retrieval']:+.2f}, residual mlp "
            f"{state['residual_shift']['mlp']:+.2f}, seed weight {state['seed_weight']:.2f}, "
            f"MLP v{state['mlp_version']} ({state['stats'].get('retrains', 0)} retrains, "
            f"{state['stats'].get('refits', 0)} encoder refits)")


def _timing(predictor: Predictor, prompts: list[str], lengths, batches: int = 8) -> dict:
    """ms per prompt of predict then observe, batches of 32 new prompts, retraining off the
    path (served, it runs in a background thread or a Celery worker)."""
    predictor.retrain_hook = lambda model: None
    predictor.embedder.cache.clear()
    predict_s, observe_s = [], []
    for b in range(min(batches, len(prompts) // BATCH)):
        chunk = slice(b * BATCH, (b + 1) * BATCH)
        t0 = time.perf_counter()
        predictor.predict(prompts[chunk], EVAL_MODEL)
        t1 = time.perf_counter()
        predictor.observe([Completion(EVAL_MODEL, p, int(n), f"timing-{b}-{j}")
                           for j, (p, n) in enumerate(zip(prompts[chunk], lengths[chunk]))])
        predict_s.append(t1 - t0)
        observe_s.append(time.perf_counter() - t1)
    per = lambda xs: float(np.median(xs)) / BATCH * 1e3
    total = per(np.add(predict_s, observe_s))
    return {"batch32_ms_per_prompt": total, "batch32_per_s": 1e3 / total,
            "note": f"predict {per(predict_s):.1f} + observe {per(observe_s):.1f} ms/prompt"}


def _observed_only(data: ShiftData, config: PredictorConfig, metric, suffix: str,
                   vectors: VectorReuse | None = None) -> Row:
    n = len(data.observe_prompts)
    alone = EvalData(data.observe_prompts, np.asarray(data.observe_lengths),
                     data.seed.test_prompts, data.seed.test_lengths)
    predictor = build_predictor(alone, config, vectors=vectors)
    row = _row(predictor, alone.test_prompts, metric,
               f"observed only ({n}){suffix}", "ALISE on the observed completions alone")
    predictor.store.close()
    return row
