"""Grammar compiles off the critical path: a request with structured output waits outside the
scheduler while its grammar compiles on a worker thread, and the other requests' iterations go
on; a schema that cannot compile ends only its own request, with the compiler's message. The
compiler is slowed or broken by the test (the real one is wrapped), so the order of events is
fixed, not timed."""
from __future__ import annotations

import json
import threading

import pytest

from lenserve.engine.llm_engine import EngineConfig, LLMEngine
from lenserve_contract.errors import InvalidRequestError
from lenserve_contract.sampling_params import SamplingParams, StructuredOutput
from services.executor.structured import GrammarCache
from tests.executor.sampling_models import json_executor

pytest.importorskip("xgrammar")

SCHEMA = json.dumps({"type": "object", "required": ["a"], "additionalProperties": False,
                     "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9}}})
PLAIN = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)


def json_params(schema: str = SCHEMA) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=20,
                          structured_output=StructuredOutput("json_schema", schema))


@pytest.fixture
def engine():
    executor = json_executor(num_gpu_blocks=64, block_size=16, max_model_len=128)
    return LLMEngine(EngineConfig(model="opt-tiny", max_model_len=128), executor=executor)


class Compiler:
    """Wraps ``GrammarCache.compile``: records the thread of each call; the first call of a
    schema blocks until ``release`` (or fails with ``fail`` when set)."""

    def __init__(self, monkeypatch, fail: str | None = None):
        self.release, self.started = threading.Event(), threading.Event()
        self.threads: list[str] = []
        self.fail = fail
        real = GrammarCache.compile

        def compile_(cache, so):
            self.threads.append(threading.current_thread().name)
            if len(self.threads) == 1:
                self.started.set()
                self.release.wait(timeout=5)
            if self.fail is not None and so.schema == self.fail:
                raise InvalidRequestError("response_format: the JSON schema cannot be "
                                          "compiled: rejected by the test", "response_format")
            return real(cache, so)
        monkeypatch.setattr(GrammarCache, "compile", compile_)


def tokens_by_request(outputs, into: dict) -> None:
    for out in outputs:
        into[out.request_id] = out


def test_other_requests_step_while_a_grammar_compiles(engine, monkeypatch):
    compiler = Compiler(monkeypatch)
    engine.add_request("plain", prompt="Hello", sampling_params=PLAIN)
    engine.step()
    engine.add_request("json", prompt="Hi", sampling_params=json_params())
    assert compiler.started.wait(5)
    seen: dict = {}
    for _ in range(8):      # the compile is blocked all this time
        tokens_by_request(engine.step(), seen)
    assert len(seen["plain"].outputs[0].token_ids) == 9
    assert "json" not in seen            # not scheduled while compiling: no token
    assert compiler.threads[0] != threading.current_thread().name
    compiler.release.set()
    while engine.has_unfinished_requests():
        tokens_by_request(engine.step(), seen)
    assert json.loads(seen["json"].outputs[0].text)["a"] in range(10)
    assert seen["json"].finished and seen["plain"].outputs[0].finish_reason == "length"
    # A second request of the same schema is let in at once (the compile is cached).
    engine.add_request("again", prompt="Hi", sampling_params=json_params())
    assert engine.step()[0].request_id == "again"


def test_a_schema_that_fails_to_compile_ends_only_its_request(engine, monkeypatch):
    bad = json.dumps({"type": "object", "properties": {"b": {"type": "string"}}})
    compiler = Compiler(monkeypatch, fail=bad)
    compiler.release.set()
    engine.add_request("plain", prompt="Hello", sampling_params=PLAIN)
    engine.add_request("bad", prompt="Hi", sampling_params=json_params(bad))
    seen: dict = {}
    while engine.has_unfinished_requests():
        tokens_by_request(engine.step(), seen)
    assert seen["bad"].outputs[0].finish_reason == "error"
    assert "rejected by the test" in seen["bad"].error
    assert seen["bad"].outputs[0].token_ids == []
    assert len(seen["plain"].outputs[0].token_ids) == 30
    # The failure is remembered: the same schema is not compiled again.
    engine.add_request("bad2", prompt="Hi", sampling_params=json_params(bad))
    calls = len(compiler.threads)
    assert engine.step()[0].outputs[0].finish_reason == "error"
    assert len(compiler.threads) == calls


def test_a_request_aborted_while_its_grammar_compiles_ends_as_aborted(engine, monkeypatch):
    compiler = Compiler(monkeypatch)
    engine.add_request("json", prompt="Hi", sampling_params=json_params())
    assert engine.has_unfinished_requests() and engine.get_num_unfinished_requests() == 1
    with pytest.raises(InvalidRequestError, match="already in use"):
        engine.add_request("json", prompt="Hi", sampling_params=json_params())
    out = engine.abort_request("json")
    assert out.finished and out.outputs[0].finish_reason == "abort"
    assert not engine.has_unfinished_requests()
    compiler.release.set()


def test_the_grpc_executor_compiles_beside_its_iterations(engine, monkeypatch):
    """Over ``executor.proto``: ``CompileGrammar`` runs on the executor's compile threads, and
    a schema it cannot compile is INVALID_ARGUMENT with the message."""
    from tests.executor.remote import ServedExecutor
    bad = json.dumps({"type": "object", "properties": {"c": {"type": "number"}}})
    compiler = Compiler(monkeypatch, fail=bad)
    served = ServedExecutor(engine.executor)
    try:
        client = served.client()
        done = threading.Thread(target=client.compile_grammar,
                                args=(StructuredOutput("json_schema", SCHEMA),))
        done.start()
        assert compiler.started.wait(5)
        compiler.release.set()
        done.join(10)
        with pytest.raises(InvalidRequestError, match="rejected by the test") as err:
            client.compile_grammar(StructuredOutput("json_schema", bad))
        assert err.value.field == "response_format"
    finally:
        served.stop()
    assert all(name.startswith("executor-grammar") for name in compiler.threads)
