"""Predictions off the serving loop: arriving requests are predicted in batches on a worker
thread and their results picked up at the start of a later iteration; finished requests are
reported back (in-process ``observe`` or the Kafka topic) from the same thread. Nothing here
ever blocks an iteration, and a failing predictor only costs default predictions."""
from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable

from services.hardware import keep_torch_single_threaded
from services.predictor.interface import LengthPredictor, PredictQuery
from services.predictor.types import Completion
from services.predictor.types import Prediction as PredictorPrediction
from services.scheduler.request import Prediction

log = logging.getLogger(__name__)

# A burst of arrivals is predicted in batches of at most this many prompts (the encoder's
# sweet spot on a CPU; larger batches only delay the first results).
MAX_BATCH = 32
# Completion records waiting to be reported; beyond it the oldest are dropped and counted.
MAX_PENDING_COMPLETIONS = 10_000


def to_scheduler(p: PredictorPrediction) -> Prediction:
    return Prediction(max(1, int(p.length)), max(int(p.upper_quantile), int(p.length)),
                      p.source.value)


class PredictionPump:
    def __init__(self, predictor: LengthPredictor, model: str,
                 completion_sink: Callable[[list[Completion]], None] | None = None,
                 on_close: Callable[[], None] | None = None, publisher=None):
        """``completion_sink``: where finished requests go (default ``predictor.observe``);
        ``on_close``: releases it (e.g. the Kafka publisher's thread); ``publisher``: the
        ``CompletionPublisher`` behind the sink, if any, whose counters ``counters()`` adds."""
        self.predictor = predictor
        self.publisher = publisher
        self.model = model
        self.sink = completion_sink or predictor.observe
        self._on_close = on_close
        self._queries: deque[tuple[str, PredictQuery]] = deque()
        self._completions: deque[Completion] = deque(maxlen=MAX_PENDING_COMPLETIONS)
        self._results: deque[tuple[str, Prediction]] = deque()
        self._wake = threading.Event()
        self._stop = False
        self._busy = False      # set before the worker takes items, so idle() never lies
        self.busy_s = 0.0                 # time spent predicting/observing (off the loop)
        self.num_predicted = 0
        self.num_observed = 0
        self.num_dropped_completions = 0
        self._failing_since_drops = 0     # records dropped since reporting last worked
        self._thread = threading.Thread(target=self._run, name="lenserve-predictor", daemon=True)
        self._thread.start()

    # -- serving-loop side (never blocks) -----------------------------------------------------
    def submit(self, request_id: str, query: PredictQuery) -> None:
        if self.predictor.inline:
            self._results.append((request_id, to_scheduler(
                self.predictor.predict([query], self.model)[0])))
            self.num_predicted += 1
            return
        self._queries.append((request_id, query))
        self._wake.set()

    def report(self, completion: Completion) -> None:
        if len(self._completions) == self._completions.maxlen:
            self.num_dropped_completions += 1
        self._completions.append(completion)
        self._wake.set()

    def drain(self) -> list[tuple[str, Prediction]]:
        out = []
        while self._results:
            out.append(self._results.popleft())
        return out

    def counters(self) -> dict[str, int]:
        """The ``SchedulerStats`` fields this pump (and its Kafka publisher) account for."""
        out = {"num_predictions": self.num_predicted,
               "num_completions_reported": self.num_observed,
               "num_completions_dropped": self.num_dropped_completions}
        if self.publisher is not None:
            out.update(num_kafka_published=self.publisher.num_published,
                       num_kafka_buffered=self.publisher.num_buffered,
                       num_kafka_dropped=self.publisher.num_dropped)
        return out

    def idle(self) -> bool:
        return not (self._queries or self._completions or self._busy)

    # -- worker side --------------------------------------------------------------------------
    def _run(self) -> None:
        keep_torch_single_threaded()      # the serving loop's thread owns the OpenMP team
        while not self._stop:
            if not (self._queries or self._completions):
                self._wake.wait(0.5)
                self._wake.clear()
                continue
            self._busy = True
            start = time.perf_counter()
            try:
                self._predict_batch()
                self._observe_batch()
            finally:
                self.busy_s += time.perf_counter() - start
                self._busy = False

    def _predict_batch(self) -> None:
        batch = []
        while self._queries and len(batch) < MAX_BATCH:
            batch.append(self._queries.popleft())
        if not batch:
            return
        try:
            preds = self.predictor.predict([q for _, q in batch], self.model)
        except Exception as exc:  # noqa: BLE001 - implementations should not raise; be safe
            log.warning("prediction failed, requests keep their default order: %s", exc)
            return
        self.num_predicted += len(batch)
        self._results.extend((rid, to_scheduler(p)) for (rid, _), p in zip(batch, preds))

    def _observe_batch(self) -> None:
        batch = []
        while self._completions and len(batch) < MAX_BATCH * 4:
            batch.append(self._completions.popleft())
        if not batch:
            return
        try:
            self.sink(batch)
        except Exception as exc:  # noqa: BLE001 - learning is best effort, serving goes on
            # Once per outage, not once per batch: a peer down under load would flood the log.
            if not self._failing_since_drops:
                log.warning("completion report failed, records are dropped until it works "
                            "again (counted in num_dropped_completions): %s", exc)
            self._failing_since_drops += len(batch)
            self.num_dropped_completions += len(batch)
            return
        self.num_observed += len(batch)
        if self._failing_since_drops:
            log.warning("completion reports work again; %d records were dropped meanwhile",
                        self._failing_since_drops)
            self._failing_since_drops = 0

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Wait until every queued prediction and completion was handled (tests, shutdown)."""
        deadline = time.monotonic() + timeout_s
        while not self.idle() and time.monotonic() < deadline:
            self._wake.set()
            time.sleep(0.005)
        return self.idle()

    def close(self) -> None:
        self.flush(5.0)
        self._stop = True
        self._wake.set()
        self._thread.join(timeout=5)
        if self._on_close is not None:
            self._on_close()
        self.predictor.close()
