"""SchedulerOutput -> ExecutorInput -> executor.proto -> ExecutorInput, every field."""
from __future__ import annotations

import dataclasses

from lenserve_contract.convert import sampling_params_from_proto, sampling_params_to_proto
from lenserve_contract.sampling_params import SamplingParams, StructuredOutput
from services.executor import convert
from services.executor.types import (
    ExecutorInput,
    ExecutorOutput,
    IterationTimings,
    ScheduledSequence,
)


def full_input() -> ExecutorInput:
    params = SamplingParams(temperature=0.5, top_k=7, top_p=0.9, seed=3, max_tokens=11,
                            min_tokens=2, stop=["x", "yz"], stop_token_ids=[4, 5], ignore_eos=True,
                            min_p=0.05, logprobs=3, presence_penalty=0.5, frequency_penalty=-0.5,
                            repetition_penalty=1.5, logit_bias={3: 2.5, 7: -100.0},
                            structured_output=StructuredOutput("json_schema", '{"type": "object"}'),
                            truncate_prompt_tokens=7, cap_max_tokens=True, detokenize=True, n=3)
    seqs = [ScheduledSequence("a", [1, 2, 3], 0, [4, 5], False, params, 0, False),
            ScheduledSequence("b", [9], 17, [8], True, SamplingParams(detokenize=False), 3,
                              True, [4, 5]),
            ScheduledSequence("c", [7], 20, [], True, params, 2, host_block_table=[11, 3])]
    return ExecutorInput(iteration=41, sequences=seqs, copy_blocks=[(1, 2), (3, 4)],
                         finished_request_ids=["gone", "also-gone"], waves=[[1], [0], [2]],
                         swap_out=[(5, 0), (6, 1)], swap_in=[(2, 9)], swap_buffer="shm-x")


def test_every_input_field_is_set_and_survives_the_round_trip():
    batch = full_input()
    for f in dataclasses.fields(ExecutorInput):         # a new field must be set here too
        assert getattr(batch, f.name) not in (None, [], "", 0), f.name
    for f in dataclasses.fields(ScheduledSequence):
        assert any(getattr(s, f.name) not in (None, [], "") for s in batch.sequences), f.name
    back = convert.input_from_proto(convert.input_to_proto(batch))
    assert back == batch


def test_every_sampling_parameter_is_set_and_survives_the_round_trip():
    params = full_input().sequences[0].sampling_params
    default = SamplingParams()
    for f in dataclasses.fields(SamplingParams):    # a new parameter must be set here too
        if f.name != "detokenize":                  # its default is the only other value
            assert getattr(params, f.name) != getattr(default, f.name), f.name
    back = sampling_params_from_proto(sampling_params_to_proto(params))
    assert back == params


def test_logprobs_survive_the_stream_chunk():
    from lenserve_contract.outputs import CompletionOutput, Logprob, RequestOutput
    from services.scheduler.convert import chunk_from_output, output_from_chunk
    entries = [Logprob(5, -0.25, [(5, -0.25), (9, -2.5)]), Logprob(6, -1.0, [])]
    out = RequestOutput("r", None, [1, 2], [CompletionOutput(0, "ab", [5, 6], logprobs=entries)],
                        False)
    back = output_from_chunk(chunk_from_output(out, 2, True), None, [1, 2])
    assert back.outputs[0].logprobs == entries


def test_no_waves_stays_none():
    batch = ExecutorInput(1, [])
    assert convert.input_from_proto(convert.input_to_proto(batch)).waves is None


def test_every_output_field_survives_the_round_trip():
    timings = IterationTimings(1.5, 0.25, 0.125, 2.0, 0.5, [0.125, 0.125])
    for f in dataclasses.fields(IterationTimings):
        assert getattr(timings, f.name) not in (0.0, []), f.name
    out = ExecutorOutput(7, {"a": 5, "b": 6}, {"a": -0.5, "b": -1.25}, timings,
                         {"a": [(5, -0.5), (3, -2.0)], "b": []})
    back = convert.output_from_proto(convert.output_to_proto(out))
    assert back == out


def test_the_proto_bytes_parse_back():
    from lenserve_contract.proto import executor_pb2
    data = convert.input_to_proto(full_input()).SerializeToString()
    msg = executor_pb2.ExecuteRequest.FromString(data)
    assert convert.input_from_proto(msg) == full_input()


def test_model_info_carries_every_eos_id():
    from services.executor.convert import model_info_from_proto, model_info_to_proto
    from services.executor.types import ModelInfo
    info = ModelInfo(name="m", family="llama", vocab_size=300, num_layers=2, num_heads=4,
                     num_kv_heads=2, head_dim=8, max_model_len=64, block_size=4,
                     num_gpu_blocks=16, bytes_per_block=1024, eos_token_id=128001,
                     dtype="bfloat16", attention_backend="torch",
                     eos_token_ids=(128001, 128008, 128009))
    assert model_info_from_proto(model_info_to_proto(info)) == info
    single = dataclasses.replace(info, eos_token_id=None, eos_token_ids=())
    assert model_info_from_proto(model_info_to_proto(single)) == single
