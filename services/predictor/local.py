"""The LengthPredictor implementations the serving loop can be given: ``embedded`` (the ALISE
predictor in this process), ``grpc://HOST:PORT`` (the predictor service) and ``oracle``."""
from __future__ import annotations

import gzip
import json
import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from services.predictor.interface import LengthPredictor, PredictQuery
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


def _oracle(q: PredictQuery) -> Prediction:
    n = q.true_output_len if q.true_output_len is not None else q.max_tokens
    return Prediction(n, Source.ORACLE, 1.0, n)


class EmbeddedPredictor(LengthPredictor):
    """The ALISE predictor core in-process, seeded from a length file."""

    name = "embedded"

    def __init__(self, core, model: str):
        self.core = core
        self.model = model

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
    from services.predictor.config import PredictorConfig
    from services.predictor.core import Predictor

    core = Predictor(PredictorConfig(default_model=model))
    prompts, lengths = load_seed(seed_path or BUNDLED_SEED)
    vectors = None if seed_path else bundled_vectors(core.embedder, len(prompts))
    if vectors is not None:
        core.store.upsert(model, vectors, np.asarray(lengths, np.float32), 0.0, observed=False)
        core.load_mlp(model, str(BUNDLED_MLP))
    else:
        _embed_seed(core, model, prompts, lengths, progress)
        _train_mlp(core, model)
    return EmbeddedPredictor(core, model)


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


def make_predictor(spec: str, model: str, seed_path: str | None = None, progress=None
                   ) -> LengthPredictor | None:
    """``none`` | ``embedded`` | ``oracle`` | ``grpc://HOST:PORT``."""
    if spec in ("", "none"):
        return None
    if spec == "oracle":
        return OraclePredictor()
    if spec == "embedded":
        return build_embedded(model, seed_path, progress)
    if spec.startswith("grpc://"):
        return GrpcPredictor(spec.removeprefix("grpc://"))
    raise ValueError(f"unknown predictor {spec!r}; use none, embedded, oracle or grpc://HOST:PORT")
