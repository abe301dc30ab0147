"""Structured output and sampling state on a random-weight model (opt-tiny with a byte-level
tokenizer): the grammar mask makes even random weights write JSON that follows the schema;
a seed gives the same text alone or batched; penalty history survives a reset."""
from __future__ import annotations

import json

import pytest
import torch

from lenserve.engine.llm_engine import EngineConfig, LLMEngine
from lenserve_contract.errors import InvalidRequestError
from lenserve_contract.sampling_params import SamplingParams, StructuredOutput
from services.executor.sampler import SamplerOutput
from services.executor.sampling_state import SamplingState
from services.executor.types import ScheduledSequence
from tests.executor.sampling_models import json_executor

pytest.importorskip("xgrammar")

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["name", "age", "ok"],
          "properties": {"name": {"type": "string", "maxLength": 6},
                         "age": {"type": "integer", "minimum": 0, "maximum": 120},
                         "ok": {"type": "boolean"},
                         "kind": {"enum": ["a", "bc"]}}}


@pytest.fixture(scope="module")
def engine():
    executor = json_executor(num_gpu_blocks=128, block_size=16, max_model_len=256)
    return LLMEngine(EngineConfig(model="opt-tiny", max_model_len=256), executor=executor)


def run(engine, prompts: dict[str, tuple[str, SamplingParams]]) -> dict:
    for rid, (prompt, params) in prompts.items():
        engine.add_request(rid, prompt=prompt, sampling_params=params)
    done = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out.outputs[0]
    return done


def test_random_weights_write_json_that_follows_the_schema(engine):
    so = StructuredOutput("json_schema", json.dumps(SCHEMA))
    params = [SamplingParams(temperature=t, seed=s, max_tokens=120, structured_output=so)
              for t, s in ((0.0, None), (1.0, 1), (1.5, 2), (1.0, 3))]
    outs = run(engine, {f"r{i}": ("Hello", p) for i, p in enumerate(params)})
    for out in outs.values():
        # strict=False: xgrammar (0.2.8) lets this tokenizer's single control-byte tokens into
        # strings, which strict JSON wants escaped; the structure is what is checked here.
        value = json.loads(out.text, strict=False)
        assert set(value) >= {"name", "age", "ok"} and set(value) <= set(SCHEMA["properties"])
        assert len(value["name"]) <= 6 and 0 <= value["age"] <= 120
        assert isinstance(value["ok"], bool) and out.finish_reason == "stop"


def test_without_the_mask_random_weights_write_no_json(engine):
    out = run(engine, {"plain": ("Hello", SamplingParams(temperature=0, max_tokens=40))})["plain"]
    with pytest.raises(ValueError):
        json.loads(out.text)


def test_json_object_starts_an_object(engine):
    params = SamplingParams(temperature=1.0, seed=5, max_tokens=30,
                            structured_output=StructuredOutput("json_object"))
    out = run(engine, {"obj": ("Hi", params)})["obj"]
    assert out.text.startswith("{")


def test_a_schema_that_cannot_compile_is_refused_when_added(engine):
    bad = StructuredOutput("json_schema", '{"type": "objec"}')
    with pytest.raises(InvalidRequestError, match="objec") as err:
        engine.add_request("bad", prompt="x", sampling_params=SamplingParams(
            structured_output=bad))
    assert err.value.field == "response_format"


def test_a_logit_bias_outside_the_vocabulary_is_refused(engine):
    with pytest.raises(InvalidRequestError, match="outside the vocabulary") as err:
        engine.add_request("bad", prompt="x", sampling_params=SamplingParams(
            logit_bias={10**6: 1.0}))
    assert err.value.field == "logit_bias"


def test_a_seed_gives_the_same_text_alone_or_batched(engine):
    mine = SamplingParams(temperature=1.0, seed=42, max_tokens=12, presence_penalty=0.5,
                          logprobs=2, ignore_eos=True)
    alone = run(engine, {"me": ("The quick", mine)})["me"]
    crowd = {f"o{i}": (f"other {i}", SamplingParams(temperature=1.0, max_tokens=6 + i))
             for i in range(4)}
    batched = run(engine, {**crowd, "me": ("The quick", mine)})["me"]
    assert alone.token_ids == batched.token_ids
    assert [e.token_id for e in alone.logprobs] == alone.token_ids


def test_penalty_history_is_rebuilt_from_the_context_after_a_reset():
    """Counted step by step, or rebuilt at once from the context a whole block table brings
    (after a preemption or a swap): the same penalties."""
    params = SamplingParams(frequency_penalty=1.0, repetition_penalty=1.2)

    def seq(tokens, computed, delta, context=(), n_out=0):
        return ScheduledSequence("r", tokens, computed, [0], True, params, n_out, delta,
                                 list(context))

    def entries(penalties):
        index, values = penalties.index.tolist(), penalties.values[0].tolist()
        return sorted(zip(index[1], values))

    steady = SamplingState(torch.device("cpu"))
    fed, sampled = seq([1, 2, 3], 0, False), [4, 4, 5]
    for n_out, token in enumerate(sampled):
        if n_out:
            fed = seq([sampled[n_out - 1]], 2 + n_out, True, n_out=n_out)
        steady.observe([fed])
        steady.prepare([fed])
        steady.advance([fed], SamplerOutput([token], [0.0]))
    last = seq([5], 5, True, n_out=3)
    steady.observe([last])
    rebuilt = SamplingState(torch.device("cpu"))
    resumed = seq([5], 5, False, context=[1, 2, 3, 4, 4], n_out=3)
    rebuilt.observe([resumed])
    want = [(1, 0.0), (2, 0.0), (3, 0.0), (4, 2.0), (5, 1.0)]
    assert entries(steady.prepare([last])[0]) == entries(rebuilt.prepare([resumed])[0]) == want


def test_the_grpc_executor_samples_as_the_in_process_one(engine):
    """Penalties, logprobs, a seed and a grammar through ``executor.proto``: the same tokens
    and log-probabilities as in process (the history travels as context_token_ids)."""
    from tests.executor.remote import ServedExecutor
    so = StructuredOutput("json_schema", json.dumps(SCHEMA))
    params = {"pen": SamplingParams(temperature=1.0, seed=9, max_tokens=10, ignore_eos=True,
                                    frequency_penalty=1.0, repetition_penalty=1.3, logprobs=3),
              "json": SamplingParams(temperature=0.8, seed=4, max_tokens=60,
                                     structured_output=so, logit_bias={5: -5.0})}
    local = run(engine, {k: ("Hello there", p) for k, p in params.items()})
    served = ServedExecutor(engine.executor)
    try:
        remote = LLMEngine(EngineConfig(model="opt-tiny", max_model_len=256),
                           executor=served.client(), tokenizer=engine.tokenizer)
        got = run(remote, {k + "-remote": ("Hello there", p) for k, p in params.items()})
    finally:
        served.stop()
    for k in params:
        assert got[k + "-remote"].token_ids == local[k].token_ids, k
    for a, b in zip(got["pen-remote"].logprobs, local["pen"].logprobs):
        assert [t for t, _ in a.top] == [t for t, _ in b.top]
        assert [lp for _, lp in a.top] == pytest.approx([lp for _, lp in b.top], abs=1e-5)


def test_unseeded_sampling_differs_between_two_executors():
    """Two executors of the same weights, as two restarts of a server: without a seed they
    do not repeat each other."""
    outs = []
    for _ in range(2):
        executor = json_executor(num_gpu_blocks=32, block_size=16, max_model_len=128)
        eng = LLMEngine(EngineConfig(model="opt-tiny", max_model_len=128), executor=executor)
        outs.append(run(eng, {"r": ("Hi", SamplingParams(temperature=1.0, max_tokens=16,
                                                          ignore_eos=True))})["r"].token_ids)
    assert outs[0] != outs[1]
