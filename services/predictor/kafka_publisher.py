"""The scheduler's side of the `completions` topic, built never to hold up serving.

``publish`` only appends to a bounded buffer. One background thread connects to Kafka (lazily,
and again after any failure, with backoff), sends what is buffered and takes records out only
once Kafka has acknowledged them. While Kafka is down the records wait; past ``max_buffered``
the oldest are dropped and counted (``num_dropped``). A batch that failed part-way is sent
again, so delivery is at least once: the predictor's DB update tolerates a repeated record.

The producer is created on the thread, not in the constructor, because kafka-python's
``KafkaProducer`` refuses to construct without a reachable broker, and its ``send`` blocks
for ``max_block_ms`` waiting for metadata: neither may happen on the serving path.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable

from services.predictor.kafka_bus import TOPIC, CompletionProducer
from services.predictor.types import Completion

log = logging.getLogger(__name__)


class CompletionPublisher:
    def __init__(self, bootstrap: str, topic: str = TOPIC, *, max_buffered: int = 10_000,
                 batch_size: int = 256, send_timeout_s: float = 5.0,
                 backoff_s: tuple[float, float] = (0.5, 30.0),
                 producer_factory: Callable[[], CompletionProducer] | None = None):
        if max_buffered < 1:
            raise ValueError(f"max_buffered must be >= 1, got {max_buffered}")
        self.bootstrap, self.topic = bootstrap, topic
        self.batch_size, self.send_timeout_s = batch_size, send_timeout_s
        self.backoff_s = backoff_s
        self._factory = producer_factory or self._new_producer
        self._buffer: deque[Completion] = deque(maxlen=max_buffered)
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._producer: CompletionProducer | None = None
        self.num_published = self.num_dropped = 0
        self._num_failures = 0
        self._thread = threading.Thread(target=self._run, name="lenserve-kafka", daemon=True)
        self._thread.start()

    # -- serving side (never blocks on Kafka) --------------------------------------------------
    def publish(self, records: list[Completion]) -> None:
        with self._lock:
            overflow = max(0, len(self._buffer) + len(records) - self._buffer.maxlen)
            if overflow and not self.num_dropped:
                log.warning("Kafka at %s is behind: the completion buffer is full, dropping "
                            "the oldest records (counted in num_dropped)", self.bootstrap)
            self.num_dropped += overflow
            self._buffer.extend(records)
        self._wake.set()

    @property
    def num_buffered(self) -> int:
        return len(self._buffer)

    @property
    def connected(self) -> bool:
        return self._producer is not None

    # -- the thread ----------------------------------------------------------------------------
    def _run(self) -> None:
        delay = self.backoff_s[0]
        while not self._stop.is_set():
            if not self._buffer:
                self._wake.wait(0.5)
                self._wake.clear()
                continue
            if self._send_some():
                delay = self.backoff_s[0]
            else:
                self._stop.wait(delay)
                delay = min(delay * 2, self.backoff_s[1])

    def _send_some(self) -> bool:
        """Send one batch; True if Kafka took it."""
        with self._lock:
            batch = [self._buffer[i] for i in range(min(self.batch_size, len(self._buffer)))]
        try:
            producer = self._connect()
            futures = [producer.send(record) for record in batch]
            producer.flush(self.send_timeout_s)
            for future in futures:      # flush returns once delivery ended, failed or not
                future.get(timeout=self.send_timeout_s)
        except Exception as exc:  # noqa: BLE001 - any Kafka failure: keep the records, retry
            self._disconnect(exc)
            return False
        self._take(batch)
        return True

    def _take(self, batch: list[Completion]) -> None:
        """Remove the sent records, minding that overflow may have dropped some meanwhile."""
        with self._lock:
            for record in batch:
                if self._buffer and self._buffer[0] is record:
                    self._buffer.popleft()
            self.num_published += len(batch)

    def _connect(self) -> CompletionProducer:
        if self._producer is None:
            self._producer = self._factory()
            log.info("publishing completion records to Kafka at %s", self.bootstrap)
        return self._producer

    def _disconnect(self, exc: Exception) -> None:
        self._num_failures += 1
        if self._producer is not None:
            log.warning("Kafka at %s failed (%s); %d records wait", self.bootstrap, exc,
                        len(self._buffer))
            producer, self._producer = self._producer, None
            try:
                producer.close()
            except Exception:  # it is being dropped anyway
                log.debug("closing the Kafka producer failed", exc_info=True)
        else:
            log.debug("Kafka at %s unreachable: %s", self.bootstrap, exc)

    def _new_producer(self) -> CompletionProducer:
        timeout_ms = int(self.send_timeout_s * 1000)
        return CompletionProducer(self.bootstrap, self.topic, max_block_ms=timeout_ms,
                                  request_timeout_ms=timeout_ms)

    def close(self, timeout_s: float = 5.0) -> None:
        """Send what is buffered, for up to ``timeout_s`` and only while Kafka answers (a
        failed attempt ends the wait: shutdown does not sit out a dead broker), then stop."""
        self._wake.set()
        failures = self._num_failures
        deadline = time.monotonic() + timeout_s
        while self._buffer and self._num_failures == failures and time.monotonic() < deadline:
            time.sleep(0.02)
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=timeout_s + self.send_timeout_s)
        if self._producer is not None:
            self._producer.close()
