import pytest
from engine_helpers import make_engine, run_to_completion

from services.executor.fake import CharTokenizer
from lenserve_contract.sampling_params import InvalidRequestError, SamplingParams
from services.scheduler.policies import POLICIES, register_policy  # noqa: F401

PROMPTS = [f"prompt number {i}: " + "x" * (3 * i) for i in range(8)]


@pytest.fixture(params=["inprocess", "grpc"])
def transport(request):
    """The executor in this process, or behind its gRPC service: the same tokens either way."""
    from tests.executor.remote import Transports
    wrap = Transports(request.param)
    yield wrap
    wrap.close()


def generate_all(engine, prompts=PROMPTS, **params):
    for i, p in enumerate(prompts):
        engine.add_request(str(i), prompt=p, sampling_params=SamplingParams(temperature=0, **params))
    return {rid: out.outputs[0] for rid, out in run_to_completion(engine).items()}


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_outputs_do_not_depend_on_policy_batching_or_preemption(policy, transport):
    reference = generate_all(make_engine("vllm", num_gpu_blocks=256, max_model_len=128),
                             max_tokens=12)
    tight = make_engine(policy, num_gpu_blocks=20, max_model_len=80, max_num_batched_tokens=16,
                        transport=transport)
    got = generate_all(tight, max_tokens=12)
    assert {k: v.token_ids for k, v in got.items()} == {k: v.token_ids for k, v in reference.items()}
    assert {k: v.text for k, v in got.items()} == {k: v.text for k, v in reference.items()}
    if policy == "vllm":
        assert tight.stats().num_preemptions > 0


def test_stop_string_truncates_text_before_it(transport):
    full = generate_all(make_engine(), ["abc"], max_tokens=20)["0"]
    stop = full.text[5:7]
    first = full.text.find(stop)
    out = generate_all(make_engine(transport=transport), ["abc"], max_tokens=20, stop=[stop])["0"]
    assert out.text == full.text[:first]
    assert (out.finish_reason, out.stop_reason) == ("stop", stop)
    assert out.token_ids == full.token_ids[: first + len(stop)]


def test_eos_ends_generation_unless_ignored(transport):
    engine = make_engine(eos_period=5, transport=transport)
    out = generate_all(engine, ["hello"], max_tokens=200, cap_max_tokens=True)["0"]
    assert out.finish_reason == "stop" and out.token_ids[-1] == CharTokenizer().eos_token_id
    ignored = generate_all(make_engine(eos_period=5), ["hello"], max_tokens=40, ignore_eos=True)["0"]
    assert ignored.finish_reason == "length" and len(ignored.token_ids) == 40


def test_context_length_ends_generation_when_the_request_lets_max_tokens_be_capped():
    out = generate_all(make_engine(max_model_len=16), ["0123456789"], max_tokens=100,
                       cap_max_tokens=True)["0"]
    assert out.finish_reason == "length" and len(out.token_ids) == 6
    with pytest.raises(InvalidRequestError, match="maximum context length is 16") as err:
        generate_all(make_engine(max_model_len=16), ["0123456789"], max_tokens=100)
    assert (err.value.field, err.value.code) == ("max_tokens", "context_length_exceeded")


def test_truncate_prompt_tokens_keeps_the_prompts_last_tokens():
    engine = make_engine(max_model_len=16)
    engine.add_request("t", prompt="0123456789", sampling_params=SamplingParams(
        temperature=0, max_tokens=10, truncate_prompt_tokens=-1))
    out = run_to_completion(engine)["t"]
    assert out.prompt_token_ids == list(b"456789") and len(out.outputs[0].token_ids) == 10


def test_bad_input_is_refused_with_a_named_field_and_others_keep_running():
    engine = make_engine(max_model_len=16)
    engine.add_request("good", prompt="hi", sampling_params=SamplingParams(max_tokens=4))
    engine.step()
    cases = [
        ({"prompt": ""}, "prompt", "empty"),
        ({"prompt": "x" * 16}, "prompt", "context length"),
        ({}, "prompt", "required"),
        ({"prompt_token_ids": [1, 999]}, "prompt_token_ids", "999"),
        ({"prompt": "hi", "request_id": "good",
          "sampling_params": SamplingParams(max_tokens=4)}, "request_id", "already in use"),
        ({"prompt": "hi"}, "max_tokens", "maximum context length"),
    ]
    for kwargs, field, words in cases:
        rid = kwargs.pop("request_id", "bad")
        with pytest.raises(InvalidRequestError, match=words) as err:
            engine.add_request(rid, **kwargs)
        assert err.value.field == field
    bad_params = SamplingParams()
    bad_params.temperature = -1.0
    with pytest.raises(InvalidRequestError, match="temperature"):
        engine.add_request("bad", prompt="hi", sampling_params=bad_params)
    assert engine.get_num_unfinished_requests() == 1
    assert run_to_completion(engine)["good"].outputs[0].finish_reason == "length"


def test_metrics_are_ordered_engine_clock_times():
    engine = make_engine(max_num_batched_tokens=4)
    engine.add_request("a", prompt="hello world", sampling_params=SamplingParams(max_tokens=3))
    m = run_to_completion(engine)["a"].metrics
    assert m.arrival_time < m.first_scheduled_time < m.first_token_time <= m.finished_time
    assert len(m.token_times) == 3 and m.token_times == sorted(m.token_times)
    assert m.token_times[0] == m.first_token_time and m.token_times[-1] == m.finished_time


def test_abort_returns_a_final_output_and_frees_the_request():
    engine = make_engine()
    engine.add_request("a", prompt="hello", sampling_params=SamplingParams(max_tokens=50))
    engine.step()
    out = engine.abort_request("a")
    assert out.finished and out.outputs[0].finish_reason == "abort"
    assert engine.abort_request("a") is None and not engine.has_unfinished_requests()
    assert engine.stats().num_free_blocks == 64


def test_executor_failure_ends_only_that_batch(transport):
    engine = make_engine(transport=transport)
    real_execute = engine.executor.execute
    calls = {"n": 0}

    def flaky(batch):
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("device lost")
        return real_execute(batch)

    engine.executor.execute = flaky
    engine.add_request("a", prompt="hello", sampling_params=SamplingParams(max_tokens=5))
    engine.step()
    [failed] = engine.step()
    assert failed.outputs[0].finish_reason == "error" and "device lost" in failed.error
    engine.add_request("b", prompt="again", sampling_params=SamplingParams(max_tokens=3))
    assert run_to_completion(engine)["b"].outputs[0].finish_reason == "length"


def test_delta_outputs_add_up_to_the_cumulative_ones(transport):
    engine = make_engine(transport=transport)
    params = SamplingParams(max_tokens=15, temperature=0, stop=["zz"])
    engine.add_request("c", prompt="abc", sampling_params=params)
    engine.add_request("d", prompt="abc", sampling_params=params, delta=True)
    text, tokens, final = "", [], {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.request_id == "d":
                text += out.outputs[0].text
                tokens += out.outputs[0].token_ids
            final[out.request_id] = out
    assert text == final["c"].outputs[0].text and tokens == final["c"].outputs[0].token_ids


def test_swapped_out_kv_comes_back_intact(monkeypatch):
    from swap_policy import SwapOncePolicy
    monkeypatch.setitem(POLICIES, SwapOncePolicy.name, SwapOncePolicy)
    reference = generate_all(make_engine(), PROMPTS[:3], max_tokens=8)
    engine = make_engine(SwapOncePolicy.name, swap_space_gib=0.001)
    got = generate_all(engine, PROMPTS[:3], max_tokens=8)
    assert engine.stats().num_preemptions == 1
    assert engine.kv_manager.stats().bytes_swapped_in > 0
    assert {k: v.token_ids for k, v in got.items()} == {k: v.token_ids for k, v in reference.items()}
