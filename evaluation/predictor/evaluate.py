"""`lenserve predictor eval`: ALISE against its baselines on one train/test split, same run."""
from __future__ import annotations

import dataclasses
import logging
import tempfile
import time
from dataclasses import dataclass

import numpy as np

from evaluation.predictor.eval_vectors import VectorReuse
from services.predictor import datasets
from services.predictor.config import PredictorConfig, StoreConfig
from services.predictor.core import Predictor
from services.predictor.finetune import fine_tune_encoder
from services.predictor.metrics import LengthMetrics, latency_percentiles, length_metrics
from services.predictor.proxy import ProxyConfig, ProxyRegressor

log = logging.getLogger(__name__)
EVAL_MODEL = "eval"
NEVER, ALWAYS = 2.0, -2.0  # similarity thresholds that disable / force retrieval
# The tail of the training part held out to tune s0, k and the blend and to calibrate.
CALIB_FRACTION = 0.1


@dataclass(frozen=True)
class Row:
    method: str
    metrics: LengthMetrics
    p50_ms: float = float("nan")
    p99_ms: float = float("nan")
    batch32_per_s: float = float("nan")
    batch32_ms_per_prompt: float = float("nan")
    note: str = ""


@dataclass(frozen=True)
class EvalData:
    train_prompts: list[str]
    train_lengths: np.ndarray
    test_prompts: list[str]
    test_lengths: np.ndarray


def prepare(train, test, tokenizer) -> EvalData:
    return EvalData([s.prompt for s in train],
                    np.array(datasets.count_tokens(tokenizer, [s.reply for s in train])),
                    [s.prompt for s in test],
                    np.array(datasets.count_tokens(tokenizer, [s.reply for s in test])))


def build_predictor(data: EvalData, config: PredictorConfig,
                    calib_fraction: float = CALIB_FRACTION, tune: bool = True,
                    vectors: VectorReuse | None = None):
    """Seed the DB, train the MLP, then calibrate on a held-out slice of the training part.
    `vectors`: bulk-embedded prompts reused from earlier runs (timings still embed)."""
    config = dataclasses.replace(config, store=StoreConfig(qdrant_path=":memory:"),
                                 retrain_every=0, default_model=EVAL_MODEL)
    embedder = None if vectors is None else vectors.embedder(config.embedder,
                                                             config.max_prompt_chars)
    predictor = Predictor(config, embedder=embedder)
    n_fit = int(len(data.train_prompts) * (1 - calib_fraction))
    predictor.seed(EVAL_MODEL, data.train_prompts[:n_fit], data.train_lengths[:n_fit])
    predictor.retrain(EVAL_MODEL)
    if tune:
        s0, k, width = tune_retrieval(predictor, data.train_prompts[n_fit:],
                                      data.train_lengths[n_fit:])
        _with_threshold(predictor, s0, k, width)
    predictor.calibrate(EVAL_MODEL, data.train_prompts[n_fit:], data.train_lengths[n_fit:])
    predictor.seed(EVAL_MODEL, data.train_prompts[n_fit:], data.train_lengths[n_fit:])
    return predictor


def tune_retrieval(predictor: Predictor, prompts: list[str], lengths,
                   thresholds=(0.7, 0.8, 0.9, 0.95), top_ks=(4, 8, 16),
                   widths=(0.0, 0.1, 0.2)) -> tuple[float, int, float]:
    """The (s0, k, blend width) with the least mean |log error| on held-out pairs (call
    before seeding them): tuned on the training part, never on the test part."""
    vectors = predictor.embedder.encode(prompts)
    real = np.log1p(np.asarray(lengths, float))

    def err(choice: tuple[float, int, float]) -> float:
        preds = _with_threshold(predictor, *choice).predict_vectors(EVAL_MODEL, vectors)
        return float(np.mean(np.abs(np.log1p([p.length for p in preds]) - real)))
    return min(((s0, k, w) for s0 in thresholds for k in top_ks for w in widths), key=err)


def _with_threshold(predictor: Predictor, s0: float, k: int | None = None,
                    width: float | None = None) -> Predictor:
    k = k or predictor.config.top_k
    width = predictor.config.blend_width if width is None else width
    predictor.config = dataclasses.replace(predictor.config, similarity_threshold=s0, top_k=k,
                                           blend_width=width)
    return predictor


def uncached(predictor: Predictor):
    """predict with an empty vector cache: timings repeat prompts, serving predicts each once."""
    def call(prompts: list[str]):
        predictor.embedder.cache.clear()
        return predictor.predict(prompts)
    return call


def time_calls(fn, prompts: list[str], single: int = 200, batches: int = 10):
    """p50/p99 of single-prompt calls, and prompts/s and ms/prompt for batches of 32."""
    single_t = []
    for p in prompts[:single]:
        t0 = time.perf_counter()
        fn([p])
        single_t.append(time.perf_counter() - t0)
    batch_t = []
    for i in range(batches):
        chunk = [prompts[(32 * i + j) % len(prompts)] for j in range(32)]
        t0 = time.perf_counter()
        fn(chunk)
        batch_t.append(time.perf_counter() - t0)
    p50, p99 = latency_percentiles(single_t)
    per_batch = float(np.median(batch_t))
    return p50, p99, 32 / per_batch, per_batch / 32 * 1e3


def run(data: EvalData, config: PredictorConfig, proxy_config: ProxyConfig,
        width: int = 100, num_buckets: int = 10, with_proxy: bool = True,
        finetune: ProxyConfig | None = None, vectors: VectorReuse | None = None) -> list[Row]:
    """The baselines, then ALISE on the configured encoder and, with `finetune`, on an encoder
    fine-tuned on the same training records the DB and MLP learn from (never the test part)."""
    real = data.test_lengths
    metric = lambda pred, upper=None: length_metrics(pred, real, upper, width, num_buckets)
    rows = [Row("global mean", metric(np.full(len(real), data.train_lengths.mean())))]
    t0 = time.perf_counter()
    if with_proxy:
        rows.append(_proxy_row(data, proxy_config, metric))
        log.info("proxy baseline done at %.0fs", time.perf_counter() - t0)
    rows += _alise_rows(data, config, metric, vectors=vectors)
    log.info("ALISE done at %.0fs", time.perf_counter() - t0)
    if finetune is not None:
        rows += with_tuned_encoder(data, config, finetune, lambda tuned, fit_s: _alise_rows(
            data, tuned, metric, " + tuned encoder", f"encoder fine-tuned in {fit_s:.0f}s, ",
            vectors))
        log.info("ALISE with a tuned encoder done at %.0fs", time.perf_counter() - t0)
    return rows


def with_tuned_encoder(data: EvalData, config: PredictorConfig, finetune: ProxyConfig, rows_of):
    """rows_of(config on an encoder fine-tuned on the training part's fit slice, fit seconds);
    the encoder lives in a temporary directory for the call."""
    with tempfile.TemporaryDirectory(prefix="lenserve-encoder-") as tmp:
        n_fit = int(len(data.train_prompts) * (1 - CALIB_FRACTION))
        t0 = time.perf_counter()
        fine_tune_encoder(data.train_prompts[:n_fit], data.train_lengths[:n_fit], tmp, finetune)
        tuned = dataclasses.replace(config, embedder=dataclasses.replace(
            config.embedder, encoder_path=tmp))
        return rows_of(tuned, time.perf_counter() - t0)


def _alise_rows(data: EvalData, config: PredictorConfig, metric, suffix: str = "",
                note: str = "", vectors: VectorReuse | None = None) -> list[Row]:
    predictor = build_predictor(data, config, vectors=vectors)
    vectors = predictor.embedder.encode(data.test_prompts)
    s0 = predictor.config.similarity_threshold
    rows = []
    wide = predictor.config.wide_weight
    # The two halves alone; ALISE as it was (the MLP alone below s0), and as it is (the MLP
    # averaged with the wide neighbourhood's mean below s0, config.wide_weight).
    for name, threshold, weight in (("retrieval only", ALWAYS, 0.0), ("MLP only", NEVER, 0.0),
                                    ("ALISE, MLP alone below s0", s0, 0.0),
                                    ("ALISE", s0, wide)):
        predictor.config = dataclasses.replace(predictor.config, wide_weight=weight)
        preds = _with_threshold(predictor, threshold).predict_vectors(EVAL_MODEL, vectors)
        lengths = [p.length for p in preds]
        uppers = [p.upper_quantile for p in preds]
        timing = time_calls(uncached(predictor), data.test_prompts) if name == "ALISE" else ()
        share = np.mean([p.source.value == "retrieval" for p in preds])
        row_note = f"retrieval {share:.0%}" + (
            f", s0={s0}, k={predictor.config.top_k}, blend {predictor.config.blend_width}"
            if name == "ALISE" else "")
        rows.append(Row(name + suffix, metric(lengths, uppers), *timing,
                        note=(note if name == "ALISE" else "") + row_note))
    predictor.store.close()
    return rows


def _proxy_row(data: EvalData, proxy_config: ProxyConfig, metric) -> Row:
    t0 = time.perf_counter()
    proxy = ProxyRegressor(proxy_config).fit(data.train_prompts, list(data.train_lengths))
    fit_s = time.perf_counter() - t0
    pred = proxy.predict(data.test_prompts)
    timing = time_calls(proxy.predict, data.test_prompts)
    return Row("proxy (MiniLM fine-tuned)", metric(pred), *timing, note=f"fit {fit_s:.0f}s")


def describe_buckets(width: int, num_buckets: int) -> str:
    last = width * (num_buckets - 1)
    return (f"{num_buckets} buckets {width} tokens wide as in ALISE: [0,{width}), "
            f"[{width},{2 * width}), ..., [{last},inf) (last open-ended)")


def format_table(rows: list[Row]) -> str:
    head = (f"{'method':<30} {'acc':>5} {'meanRE':>7} {'medRE':>6} {'tau':>6} {'rho':>6} "
            f"{'under':>6} {'upper⊇':>6} {'p50ms':>6} {'p99ms':>6} {'b32/s':>6} {'ms/p':>5}  note")
    lines = [head]
    for r in rows:
        m = r.metrics
        lines.append(f"{r.method:<30} {m.bucket_accuracy:5.3f} {m.mean_rel_error:7.3f} "
                     f"{m.median_rel_error:6.3f} {m.kendall_tau:6.3f} {m.spearman_rho:6.3f} "
                     f"{m.under_predicted:6.3f} {m.upper_covered:6.3f} {r.p50_ms:6.1f} "
                     f"{r.p99_ms:6.1f} {r.batch32_per_s:6.0f} {r.batch32_ms_per_prompt:5.1f}  "
                     f"{r.note}")
    lines.append("p50/p99: one prompt per call; b32/s and ms/p: batches of 32 prompts")
    return "\n".join(lines)
