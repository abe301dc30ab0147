import threading
import time

from services.predictor.kafka_bus import (
    CompletionConsumer,
    CompletionProducer,
    decode,
    ensure_topic,
)
from services.predictor.types import Completion


def test_decode_skips_malformed_values():
    from services.predictor.convert import completion_to_pb

    good = completion_to_pb(Completion("m", "hi", 7, "r1")).SerializeToString()
    records, bad = decode([good, b"\xff\xff\xff not a proto"])
    assert [r.num_output_tokens for r in records] == [7] and bad == 1


def test_completions_reach_the_db_through_kafka(kafka_bootstrap, predictor):
    ensure_topic(kafka_bootstrap, "completions-test")
    producer = CompletionProducer(kafka_bootstrap, topic="completions-test")
    prompts = ["Translate 'good morning' into French.", "Write a haiku about rain."]
    for i, p in enumerate(prompts):
        producer.send(Completion("kafka-model", p, 10 + i, f"r{i}", finished_at=float(i + 1)))
    producer._producer.send("completions-test", value=b"\x08garbage")  # malformed record
    producer.flush()
    consumer = CompletionConsumer(kafka_bootstrap, predictor.observe, topic="completions-test",
                                  group_id="test-group")
    stop = threading.Event()
    thread = threading.Thread(target=consumer.run, args=(stop,), daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while consumer.applied < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    stop.set()
    thread.join(timeout=10)
    consumer.close()
    producer.close()
    assert consumer.applied == 2
    preds = predictor.predict(prompts, model="kafka-model")
    assert [p.source.value for p in preds] == ["retrieval", "retrieval"]
    assert [p.length for p in preds] == [10, 11]
