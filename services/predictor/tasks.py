"""Retraining off the serving path: in a thread of the service, or in a Celery worker.

Celery: `retrain_mlp` trains the MLP in a worker; the service swaps it in.

The worker never opens Qdrant: embedded Qdrant holds a process-level lock on its directory,
so the service exports the DB to an .npz snapshot, the task trains from the snapshot and
writes the weights to another .npz, and the service loads them and swaps atomically. The two
paths must be on a filesystem both processes see.

Worker: LENSERVE_CELERY_BROKER=redis://... celery -A services.predictor.tasks worker -Q predictor
"""
from __future__ import annotations

import dataclasses
import logging
import os
import tempfile
import threading

import numpy as np
from celery import Celery

from services.predictor import mlp
from services.predictor.config import MLPConfig

log = logging.getLogger(__name__)
QUEUE = "predictor"

app = Celery("lenserve.predictor")


def configure(broker_url: str, backend_url: str | None = None, queue: str = QUEUE) -> Celery:
    app.conf.update(broker_url=broker_url, result_backend=backend_url or broker_url,
                    task_default_queue=queue, task_serializer="json", result_serializer="json",
                    accept_content=["json"], broker_connection_retry_on_startup=True)
    return app


if os.environ.get("LENSERVE_CELERY_BROKER"):
    configure(os.environ["LENSERVE_CELERY_BROKER"])


@app.task(name="lenserve.predictor.retrain_mlp")
def retrain_mlp(data_path: str, out_path: str, mlp_config: dict) -> dict:
    with np.load(data_path) as data:
        vectors, lengths = data["vectors"], data["lengths"]
        weights = data["weights"] if "weights" in data.files else None
        encoder = str(data["encoder"]) if "encoder" in data.files else None
    module = mlp.train(vectors, lengths, MLPConfig(**mlp_config), weights)
    tmp = out_path + ".tmp.npz"
    mlp.save(module, tmp, len(vectors), encoder)
    os.replace(tmp, out_path)  # a reader never sees half-written weights
    return {"out_path": out_path, "num_records": len(vectors)}


class CeleryRetrainer:
    """Service side: snapshot → task → load + swap. Usable as Predictor.retrain_hook.
    The snapshot is the predictor's training set: seed targets already moved by the seed
    shift, observed records weighted above seed ones."""

    def __init__(self, predictor, workdir: str | None = None, queue: str = QUEUE,
                 timeout_s: float = 600.0):
        self.predictor = predictor
        self.workdir = workdir or tempfile.mkdtemp(prefix="lenserve-retrain-")
        self.queue, self.timeout_s = queue, timeout_s
        self._busy: set[str] = set()
        self._lock = threading.Lock()

    def __call__(self, model: str) -> threading.Thread | None:
        with self._lock:
            if model in self._busy:  # one retrain per model at a time; the next trigger catches up
                return None
            self._busy.add(model)
        if self.predictor.take_refit():
            # The encoder is this process's: a refit runs here, in a thread of its own.
            thread = threading.Thread(target=self._refit, args=(model,), daemon=True)
            thread.start()
            return thread
        try:
            result, data = self._submit(model)
        except Exception:
            self._done(model)
            raise
        thread = threading.Thread(target=self._await, args=(model, result, data), daemon=True)
        thread.start()
        return thread

    def _submit(self, model: str):
        data = self.predictor.training_set(model)
        if len(data.vectors) < self.predictor.config.mlp.min_train_records:
            raise ValueError(f"model {model!r} has {len(data.vectors)} records, too few to "
                             f"train")
        stem = os.path.join(self.workdir, f"{abs(hash(model)):x}")
        np.savez(stem + "-data.npz", vectors=data.vectors, lengths=data.lengths,
                 weights=data.weights, encoder=np.array(self.predictor.embedder.encoder_id))
        cfg = dataclasses.asdict(self.predictor.config.mlp)
        result = retrain_mlp.apply_async((stem + "-data.npz", stem + "-mlp.npz", cfg),
                                         queue=self.queue)
        return result, data

    def _await(self, model: str, result, data) -> None:
        try:
            info = result.get(timeout=self.timeout_s)
            version = self.predictor.load_mlp(model, info["out_path"], data)
            log.info("MLP of %s retrained on %d records, version %d", model,
                     info["num_records"], version)
        except Exception as exc:  # noqa: BLE001 - the served MLP stays; log and move on
            log.warning("retrain of %s failed: %s", model, exc)
        finally:
            self._done(model)

    def _refit(self, model: str) -> None:
        from services.hardware import keep_torch_single_threaded
        from services.predictor.learning import lowest_priority
        from services.predictor.refit import refit_encoder

        lowest_priority()
        keep_torch_single_threaded()
        try:
            refitted = refit_encoder(self.predictor) is not None
        except Exception as exc:  # noqa: BLE001 - the served encoder stays; log and move on
            log.warning("encoder refit failed: %s", exc)
            refitted = True
        self._done(model)
        if not refitted:  # nothing to refit from: the MLP retrain that was due
            try:
                self(model)
            except Exception as exc:  # noqa: BLE001 - the served MLP stays
                log.warning("retrain of %s failed: %s", model, exc)

    def _done(self, model: str) -> None:
        with self._lock:
            self._busy.discard(model)
