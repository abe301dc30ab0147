"""The LengthPredictor implementations the serving loop can be given: ``embedded`` (the ALISE
predictor in this process, from the bundled seed), ``embedded:DIR`` (the same, from a copy of
a DB ``lenserve predictor build`` wrote), ``grpc://HOST:PORT`` (the predictor service),
``oracle`` and ``oracle:SIGMA[:SEED]`` (the true length with log-normal error, for sensitivity
runs)."""
from __future__ import annotations

import dataclasses
import gzip
import json
import logging
import math
import random
import shutil
import statistics
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from services.predictor.config import PredictorConfig
from services.predictor.interface import LengthPredictor, PredictQuery
from services.predictor.learning import ThreadRetrainer
from services.predictor.types import Completion, Prediction, PredictionError, Source

log = logging.getLogger(__name__)

# 2,000 ShareGPT conversation openings (prompt cut to 400 characters, reply length in the
# presets' MiniLM WordPiece tokens): the embedded predictor's prior until it has learnt from
# served requests. See data/README.md.
BUNDLED_SEED = Path(__file__).parent / "data" / "sharegpt_seed_2k.jsonl.gz"
# The seed's prompts embedded by the stock encoder (float16), so that a fresh embedded
# predictor starts in a second instead of embedding 2,000 prompts on a busy CPU.
BUNDLED_VECTORS = BUNDLED_SEED.with_name("sharegpt_seed_2k.vectors.npz")
BUNDLED_MLP = BUNDLED_SEED.with_name("sharegpt_seed_2k.mlp.npz")   # the MLP trained on them


class OraclePredictor(LengthPredictor):
    """The true output length where the caller knows it, else ``max_tokens``: the upper
    bound for every predictor-driven policy."""

    name = "oracle"
    inline = True

    def predict(self, queries: Sequence[PredictQuery], model: str) -> list[Prediction]:
        return [_oracle(q) for q in queries]

    def observe(self, completions: Sequence[Completion]) -> None:
        pass


class NoisyOraclePredictor(OraclePredictor):
    """The true length times exp(e), e ~ N(0, sigma), from a seeded generator drawn in the
    order of the queries: prediction error of a known size, to measure how much of a
    policy's gap to ``oracle`` a given predictor quality leaves. Queries are predicted as they
    arrive, so runs of one workload (one arrival order) see the same errors whatever the
    policy. Median relative error: about 0.2 at sigma 0.3, 0.4 at 0.6, 0.6 at 1. The upper
    quantile is the true length's quantile given the prediction at the level the predictor
    reports (``PredictorConfig.upper_quantile``, 0.9: the prediction times exp(1.28 sigma)),
    as a calibrated predictor's would be."""

    def __init__(self, sigma: float, seed: int = 0):
        if not (sigma >= 0 and math.isfinite(sigma)):
            raise ValueError(f"oracle:SIGMA[:SEED] needs a finite sigma >= 0, got {sigma}")
        self.sigma = sigma
        level = PredictorConfig.upper_quantile
        self._upper = math.exp(statistics.NormalDist().inv_cdf(level) * sigma)
        self._rng = random.Random(seed)

    def predict(self, queries: Sequence[PredictQuery], model: str) -> list[Prediction]:
        out = []
        for q in queries:
            if q.true_output_len is None:       # nothing to perturb: max_tokens, as oracle
                out.append(_oracle(q))
                continue
            n = max(1, round(q.true_output_len * math.exp(self._rng.gauss(0.0, self.sigma))))
            out.append(Prediction(n, Source.ORACLE, 1.0, math.ceil(n * self._upper)))
        return out


def _oracle(q: PredictQuery) -> Prediction:
    n = q.true_output_len if q.true_output_len is not None else q.max_tokens
    return Prediction(n, Source.ORACLE, 1.0, n)


class EmbeddedPredictor(LengthPredictor):
    """The ALISE predictor core in-process, seeded from a length file."""

    name = "embedded"

    def __init__(self, core, model: str, workdir: str | None = None):
        self.core = core
        self.model = model
        self._workdir = workdir     # a private copy of a built DB, removed on close

    def predict(self, queries: Sequence[PredictQuery], model: str) -> list[Prediction]:
        try:
            return self.core.predict([q.prompt for q in queries], model or self.model)
        except Exception as exc:  # noqa: BLE001 - a broken predictor must not stop serving
            log.warning("embedded predictor failed: %s", exc)
            return [default_prediction(q, f"predictor failed: {exc}") for q in queries]

    def observe(self, completions: Sequence[Completion]) -> None:
        result = self.core.observe(completions)
        if result.rejected:
            log.info("predictor rejected %d of %d completions", result.rejected, len(completions))

    def close(self) -> None:
        self.core.close()
        if self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)
            self._workdir = None


class GrpcPredictor(LengthPredictor):
    """The predictor service; an unreachable service gives default predictions (the
    channel reconnects by itself when the service returns)."""

    name = "grpc"

    def __init__(self, target: str, timeout_s: float = 2.0):
        from services.predictor.client import PredictorClient
        self.client = PredictorClient(target, timeout_s)

    def predict(self, queries: Sequence[PredictQuery], model: str) -> list[Prediction]:
        try:
            return self.client.predict([q.prompt for q in queries], model)
        except Exception as exc:  # noqa: BLE001 - grpc.RpcError and friends
            return [default_prediction(q, f"predictor unreachable: {_short(exc)}")
                    for q in queries]

    def observe(self, completions: Sequence[Completion]) -> None:
        """Raises when the service does not take them: the caller (``PredictionPump``, off the
        serving loop) counts them as dropped."""
        try:
            self.client.observe(completions)
        except Exception as exc:  # noqa: BLE001 - grpc.RpcError and friends
            raise ConnectionError(f"predictor unreachable: {_short(exc)}") from None

    def close(self) -> None:
        self.client.close()


def default_prediction(q: PredictQuery, why: str) -> Prediction:
    n = min(256, q.max_tokens)
    return Prediction(n, Source.DEFAULT, 0.0, q.max_tokens, PredictionError("UNAVAILABLE", why))


def _short(exc: Exception) -> str:
    details = getattr(exc, "details", None)
    return details() if callable(details) else str(exc).splitlines()[0]


def load_seed(path: str | Path = BUNDLED_SEED) -> tuple[list[str], list[int]]:
    """(prompts, output lengths) from a JSON-lines file (gzip or plain) of
    ``{"prompt", "output_len"}`` records."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    prompts, lengths = [], []
    with opener(path, "rt", encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                prompts.append(str(rec["prompt"]))
                lengths.append(int(rec["output_len"]))
            except (ValueError, KeyError, TypeError) as exc:
                raise ValueError(f"{path}:{i}: expected {{\"prompt\", \"output_len\"}} "
                                 f"records: {exc}") from None
    return prompts, lengths


def build_embedded(model: str, seed_path: str | Path | None = None, progress=None
                   ) -> EmbeddedPredictor:
    """An in-memory ALISE predictor seeded from ``seed_path``, or from the bundled seed with
    its precomputed vectors and MLP (a start in seconds). A custom seed is embedded and its
    MLP trained here, with ``progress(done, total)`` called while embedding."""
    from services.predictor.core import Predictor

    core = Predictor(PredictorConfig(default_model=model))
    core.retrain_hook = ThreadRetrainer(core)
    seed_core(core, model, seed_path, progress)
    return EmbeddedPredictor(core, model)


def seed_core(core, model: str, seed_path: str | Path | None = None, progress=None) -> int:
    """Seed ``core``'s DB for ``model`` from ``seed_path``, or from the bundled seed with its
    precomputed vectors and MLP where they fit the encoder; returns the records seeded."""
    prompts, lengths = load_seed(seed_path or BUNDLED_SEED)
    vectors = None if seed_path else bundled_vectors(core.embedder, len(prompts))
    if vectors is not None:
        core.store.upsert(model, vectors, np.asarray(lengths, np.float32), 0.0, observed=False,
                          texts=core.kept_texts(prompts))
        core.load_mlp(model, str(BUNDLED_MLP))
    else:
        _embed_seed(core, model, prompts, lengths, progress)
        _train_mlp(core, model)
    return len(prompts)


def build_from_db(model: str, db_dir: str | Path) -> EmbeddedPredictor:
    """An in-memory ALISE predictor that starts from a DB ``lenserve predictor build
    --qdrant-path DIR`` wrote: its points, the encoder fine-tuned beside it and its MLP. It
    learns from served requests in a private copy, so ``DIR`` itself never changes and every
    engine given it starts from the same state (benchmarks replay the same prompts at every
    rate; a shared DB would have learnt their lengths)."""
    from services.predictor.__main__ import mlp_path
    from services.predictor.encoder_build import encoder_beside_db
    from services.predictor.config import EmbedderConfig, StoreConfig
    from services.predictor.core import Predictor

    source = Path(db_dir)
    if not source.is_dir():
        raise ValueError(f"no predictor DB at {source}: build one with `lenserve predictor "
                         f"build --qdrant-path {source} --model {model} ...`")
    encoder = encoder_beside_db(str(source), None)
    workdir, core = tempfile.mkdtemp(prefix="lenserve-predictor-"), None
    try:
        shutil.copytree(source, Path(workdir) / "db")
        config = PredictorConfig(
            default_model=model,
            embedder=EmbedderConfig(encoder if encoder and Path(encoder).is_dir() else None),
            store=StoreConfig(qdrant_path=str(Path(workdir) / "db")))
        core = Predictor(config)
        core.retrain_hook = ThreadRetrainer(core)
        models = core.store.models()
        if model not in models:
            raise ValueError(f"the predictor DB at {source} holds {', '.join(models) or 'no'} "
                             f"model(s), not {model!r}: build it with --model {model}")
        try:
            core.store.has_model(model)     # refuses vectors of another encoder
        except ValueError as exc:
            raise ValueError(f"{exc} (embedded:DIR uses the encoder at {encoder} if there is "
                             "one, else the stock MiniLM)") from None
        mlp = mlp_path(dataclasses.replace(config, store=StoreConfig(qdrant_path=str(source))),
                       model)
        if mlp and Path(mlp).exists():
            core.load_mlp(model, mlp)
        else:
            _train_mlp(core, model)
    except BaseException:
        if core is not None:
            core.store.close()
        shutil.rmtree(workdir, ignore_errors=True)
        raise
    return EmbeddedPredictor(core, model, workdir)


def bundled_vectors(embedder, num_prompts: int) -> np.ndarray | None:
    """The bundled seed's vectors if they were made by this encoder with this window."""
    try:
        data = np.load(BUNDLED_VECTORS)
    except OSError:
        return None
    same = (str(data["encoder"]) == embedder.encoder_id
            and int(data["max_seq_length"]) == embedder.max_seq_length
            and data["vectors"].shape == (num_prompts, embedder.dim))
    return data["vectors"].astype(np.float32) if same else None


def _embed_seed(core, model: str, prompts: list[str], lengths: list[int], progress) -> None:
    chunk = 256
    for start in range(0, len(prompts), chunk):
        core.seed(model, prompts[start:start + chunk], lengths[start:start + chunk])
        if progress is not None:
            progress(min(start + chunk, len(prompts)), len(prompts))


def _train_mlp(core, model: str) -> None:
    try:
        core.retrain(model)
    except ValueError as exc:   # too few records: retrieval and defaults serve
        log.info("no MLP for the seed: %s", exc)


def reads_prompts(spec: str) -> bool:
    """Whether the predictor ``spec`` names reads prompt text and learns from finished
    requests (the oracles read only the true length; ``none`` reads nothing)."""
    return spec not in ("", "none") and spec.split(":")[0] != "oracle"


def make_predictor(spec: str, model: str, seed_path: str | None = None, progress=None
                   ) -> LengthPredictor | None:
    """``none`` | ``embedded`` | ``embedded:DIR`` (a built DB) | ``oracle`` |
    ``oracle:SIGMA[:SEED]`` | ``grpc://HOST:PORT``."""
    if spec in ("", "none"):
        return None
    if spec == "oracle":
        return OraclePredictor()
    if spec.startswith("oracle:"):
        sigma, _, seed = spec.removeprefix("oracle:").partition(":")
        try:
            return NoisyOraclePredictor(float(sigma), int(seed or 0))
        except ValueError as exc:
            raise ValueError(f"oracle:SIGMA[:SEED] needs a number and an integer, got {spec!r}"
                             f" ({exc})") from None
    if spec == "embedded":
        return build_embedded(model, seed_path, progress)
    if spec.startswith("embedded:"):
        if seed_path:
            raise ValueError("--predictor-seed seeds the bundled embedded predictor; "
                             "embedded:DIR starts from the DB in DIR")
        return build_from_db(model, spec.removeprefix("embedded:"))
    if spec.startswith("grpc://"):
        return GrpcPredictor(spec.removeprefix("grpc://"))
    raise ValueError(f"unknown predictor {spec!r}; use none, embedded, embedded:DIR, oracle, "
                     "oracle:SIGMA[:SEED] or grpc://HOST:PORT")
