import argparse

import pytest

from lenserve import LLM, SamplingParams
from lenserve.commands import bench_scheduler, generate
from services.scheduler.detokenizer import IncrementalDetokenizer
from services.executor.fake import CharTokenizer
from lenserve_contract.sampling_params import InvalidRequestError
from tests.factories import write_checkpoint


def test_llm_generate_keeps_prompt_order_and_accepts_token_ids():
    llm = LLM("fake", num_gpu_blocks=64, block_size=4, max_model_len=64)
    params = SamplingParams(max_tokens=6, temperature=0)
    by_text = llm.generate(["one", "two", "three"], params)
    by_ids = llm.generate(prompt_token_ids=[list(b"one"), list(b"two"), list(b"three")],
                          sampling_params=params)
    assert [o.prompt for o in by_text] == ["one", "two", "three"]
    assert [o.outputs[0].token_ids for o in by_text] == [o.outputs[0].token_ids for o in by_ids]
    assert all(len(o.outputs[0].token_ids) == 6 and o.outputs[0].text for o in by_text)


def test_detokenize_off_gives_the_same_tokens_and_no_text():
    llm = LLM("fake", num_gpu_blocks=64, block_size=4, max_model_len=64)
    on = llm.generate(["one", "two"], SamplingParams(max_tokens=5, temperature=0))
    off = llm.generate(["one", "two"], SamplingParams(max_tokens=5, temperature=0,
                                                      detokenize=False))
    assert [o.outputs[0].token_ids for o in off] == [o.outputs[0].token_ids for o in on]
    assert all(o.outputs[0].text for o in on) and not any(o.outputs[0].text for o in off)


def test_stop_strings_without_detokenizing_are_refused():
    with pytest.raises(InvalidRequestError, match="detokenize"):
        SamplingParams(stop=["x"], detokenize=False)


def test_llm_bad_prompt_names_its_index_and_runs_nothing():
    llm = LLM("fake", num_gpu_blocks=64, block_size=4, max_model_len=64)
    with pytest.raises(InvalidRequestError, match="prompt 1: prompt is empty"):
        llm.generate(["fine", ""])
    assert not llm.engine.has_unfinished_requests()
    with pytest.raises(InvalidRequestError, match="2 sampling_params for 3 prompts"):
        llm.generate(["a", "b", "c"], [SamplingParams(), SamplingParams()])


@pytest.mark.parametrize("policy", ["vllm", "orca"])
def test_llm_on_a_real_tiny_model_is_deterministic_under_preemption(policy):
    prompts = ["the quick brown fox", "jumps over", "the lazy dog again and again"]
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    roomy = LLM("opt-tiny", num_gpu_blocks=64, block_size=4, max_model_len=64)
    tight = LLM("opt-tiny", policy=policy, num_gpu_blocks=16, block_size=4, max_model_len=64,
                max_num_batched_tokens=8)
    expect = [o.outputs[0].token_ids for o in roomy.generate(prompts, params)]
    assert [o.outputs[0].token_ids for o in tight.generate(prompts, params)] == expect


def test_incremental_detokenizer_handles_multibyte_characters():
    tok = CharTokenizer()
    text = "naïve café ✓ done"
    detok = IncrementalDetokenizer(tok, tok.encode("x"), stop=[])
    for t in tok.encode(text):
        detok.add_tokens([t])
        assert "\ufffd" not in detok.text
    assert detok.text == text


def test_stop_string_spanning_tokens_is_held_back_then_cut():
    tok = CharTokenizer()
    detok = IncrementalDetokenizer(tok, [], stop=["END"])
    sent = ""
    for ch in "abcEN":
        assert detok.add_tokens(tok.encode(ch)) is None
        sent += detok.take_delta(finished=False)
    assert sent == "abc"                       # "EN" may start the stop string
    assert detok.add_tokens(tok.encode("D")) == "END"
    assert sent + detok.take_delta(finished=True) == "abc"


def _parser(module):
    parser = argparse.ArgumentParser()
    module.register(parser.add_subparsers(dest="command"))
    return parser


def test_generate_command_prints_the_completion(capsys):
    args = _parser(generate).parse_args(
        ["generate", "--model", "fake", "--prompt", "Hello", "--max-tokens", "7",
         "--temperature", "0", "--num-gpu-blocks", "32", "--block-size", "4"])
    assert args.func(args) == 0
    printed = capsys.readouterr().out.rstrip("\n")
    expect = LLM("fake", num_gpu_blocks=32, block_size=4).generate(
        "Hello", SamplingParams(max_tokens=7, temperature=0))[0].outputs[0].text
    assert printed == expect and len(printed) == 7


def test_bench_scheduler_command_reports_timings(capsys):
    args = _parser(bench_scheduler).parse_args(
        ["bench-scheduler", "--num-requests", "300", "--iterations", "50"])
    assert args.func(args) == 0
    out = capsys.readouterr().out
    assert "waiting: start=300" in out and "schedule ms/iteration: median=" in out


def test_wordpiece_style_trailing_eos_is_dropped_from_the_prompt():
    class SepTokenizer(CharTokenizer):
        def encode(self, text):
            return [*super().encode(text), self.eos_token_id]

    llm = LLM("fake", tokenizer=SepTokenizer(), num_gpu_blocks=16, block_size=4)
    out = llm.generate("hi", SamplingParams(max_tokens=2))[0]
    assert out.prompt_token_ids == list(b"hi")


def test_llm_refuses_to_spin_when_a_policy_admits_nothing(monkeypatch):
    from services.scheduler.policies import POLICIES
    from services.scheduler.policies.vllm import VllmPolicy

    class Stuck(VllmPolicy):
        name = "test-stuck"

        def schedule(self, state, budget):
            return state.new_output()

    monkeypatch.setitem(POLICIES, Stuck.name, Stuck)
    llm = LLM("fake", policy=Stuck.name, num_gpu_blocks=16, block_size=4)
    with pytest.raises(RuntimeError, match="admitted no waiting request"):
        llm.generate("hi")


def test_checkpoint_without_tokenizer_runs_on_prompt_token_ids(tmp_path):
    llm = LLM(str(write_checkpoint(tmp_path, "llama", tokenizer=False)), num_gpu_blocks=8)
    out = llm.generate(prompt_token_ids=[5, 6, 7],
                       sampling_params=SamplingParams(max_tokens=4, temperature=0))[0]
    assert len(out.outputs[0].token_ids) == 4 and out.outputs[0].text == ""
    with pytest.raises(InvalidRequestError, match="no tokenizer files.*prompt_token_ids"):
        llm.generate("hello")


def _predictor_threads(before: frozenset = frozenset()) -> list:
    """The predictor threads running now, less those in ``before`` (engines that earlier
    tests left to the garbage collector)."""
    import threading
    return [t for t in threading.enumerate() if t.name == "lenserve-predictor"
            and t not in before]


def test_llm_stops_its_engine_threads_when_closed_or_collected():
    """A thread left running into interpreter shutdown can abort the process as torch is torn
    down under it, so the LLM closes its engine: on close(), on leaving a with block, and when
    it is collected (or at exit) if the caller never closed it."""
    import gc

    from lenserve import LLM, SamplingParams

    gc.collect()
    before = frozenset(_predictor_threads())
    with LLM(model="fake", num_gpu_blocks=64, predictor="oracle") as llm:
        assert len(_predictor_threads(before)) == 1
        llm.generate(["Hello"], SamplingParams(max_tokens=4, temperature=0))
    assert _predictor_threads(before) == []

    llm = LLM(model="fake", num_gpu_blocks=64, predictor="oracle")
    assert len(_predictor_threads(before)) == 1
    del llm
    gc.collect()
    assert _predictor_threads(before) == []
