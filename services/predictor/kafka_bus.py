"""The `completions` topic: the scheduler's producer helper and the predictor's consumer loop.

Value = lenserve_contract.proto.common_pb2.CompletionRecord serialized; key = the model name, so the
records of one model keep their order within a partition.
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence

from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import NewTopic
from kafka.errors import KafkaError, TopicAlreadyExistsError

from lenserve_contract.proto import common_pb2
from services.predictor import convert
from services.predictor.types import Completion, ObserveResult

log = logging.getLogger(__name__)
TOPIC = "completions"


def ensure_topic(bootstrap: str, topic: str = TOPIC, partitions: int = 1) -> None:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10_000)
    try:
        admin.create_topics([NewTopic(topic, partitions, 1)])
    except TopicAlreadyExistsError:
        pass
    finally:
        admin.close()


class CompletionProducer:
    """What the scheduler calls when a request finishes."""

    def __init__(self, bootstrap: str, topic: str = TOPIC, **kafka_kwargs):
        self.topic = topic
        self._producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, acks=1,
                                       **kafka_kwargs)

    def send(self, record: Completion | common_pb2.CompletionRecord):
        """Queue one record; returns kafka-python's future of its delivery."""
        pb = convert.completion_to_pb(record) if isinstance(record, Completion) else record
        return self._producer.send(self.topic, key=pb.model.encode(),
                                   value=pb.SerializeToString())

    def flush(self, timeout_s: float = 10.0) -> None:
        self._producer.flush(timeout=timeout_s)

    def close(self) -> None:
        self._producer.close(timeout=5)


def decode(values: Sequence[bytes]) -> tuple[list[Completion], int]:
    """Parse record values; returns the completions and how many values were malformed."""
    out, bad = [], 0
    for value in values:
        try:
            out.append(convert.completion_from_pb(common_pb2.CompletionRecord.FromString(value)))
        except Exception:  # noqa: BLE001 - any undecodable value is skipped and counted
            bad += 1
    return out, bad


class CompletionConsumer:
    """Reads `completions` and applies DB.update through `handle` (Predictor.observe)."""

    def __init__(self, bootstrap: str, handle: Callable[[list[Completion]], ObserveResult],
                 topic: str = TOPIC, group_id: str = "lenserve-predictor",
                 max_records: int = 256):
        self.topic, self.handle, self.max_records = topic, handle, max_records
        # Partitions are assigned by hand: a consumer-group join costs seconds of rebalancing
        # and one predictor reads every partition anyway. The group id is kept for offsets.
        self._consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group_id,
                                       enable_auto_commit=False, auto_offset_reset="earliest")
        self._assign()
        self.applied = 0
        self.malformed = 0

    def _assign(self) -> None:
        parts = self._consumer.partitions_for_topic(self.topic)
        if not parts:
            raise ValueError(f"Kafka topic {self.topic!r} does not exist")
        self._consumer.assign([TopicPartition(self.topic, p) for p in sorted(parts)])

    def poll_once(self, timeout_ms: int = 200) -> int:
        batches = self._consumer.poll(timeout_ms=timeout_ms, max_records=self.max_records)
        values = [m.value for msgs in batches.values() for m in msgs]
        if not values:
            return 0
        records, bad = decode(values)
        self.malformed += bad
        if bad:
            log.warning("skipped %d malformed completion records", bad)
        if records:
            result = self.handle(records)
            self.applied += result.accepted
        self._commit()
        return len(values)

    def _commit(self) -> None:
        try:
            self._consumer.commit()
        except KafkaError as exc:  # offsets are a restart optimisation; losing one is harmless
            log.debug("offset commit failed: %s", exc)

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                self.poll_once()
            except KafkaError as exc:
                log.warning("Kafka poll failed, retrying: %s", exc)
                stop.wait(1.0)

    def close(self) -> None:
        self._consumer.close()
