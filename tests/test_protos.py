"""The service contract: generated code is current, importable from one package, and round-trips."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from lenserve_contract.proto import common_pb2, executor_pb2, predictor_pb2, scheduler_pb2

ROOT = Path(__file__).resolve().parent.parent


def test_generated_code_is_current():
    proc = subprocess.run([sys.executable, "scripts/gen_protos.py", "--check"], cwd=ROOT,
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_generated_code_lives_in_one_package():
    generated = [p for p in ROOT.rglob("*_pb2.py") if ".git" not in p.parts]
    assert generated, "no generated code found"
    assert {p.parent for p in generated} == {ROOT / "lenserve_contract" / "proto"}


def test_execute_request_round_trip():
    req = executor_pb2.ExecuteRequest(iteration=7)
    seq = req.sequences.add(request_id="r1", token_ids=[1, 2, 3], num_computed_tokens=5,
                            block_table=[4, 9], sample=True)
    seq.sampling_params.temperature = 0.0
    req.copy_blocks.add(src=1, dst=2)
    back = executor_pb2.ExecuteRequest.FromString(req.SerializeToString())
    assert back == req
    assert back.sequences[0].sampling_params.HasField("temperature")
    assert not back.sequences[0].sampling_params.HasField("top_p")


def test_completion_record_is_the_kafka_value_type():
    rec = common_pb2.CompletionRecord(request_id="a", model="opt-125m", prompt="hi",
                                      num_prompt_tokens=2, num_output_tokens=40,
                                      finish_reason=common_pb2.FINISH_REASON_LENGTH)
    assert common_pb2.CompletionRecord.FromString(rec.SerializeToString()) == rec
    assert predictor_pb2.ObserveRequest(records=[rec]).records[0].num_output_tokens == 40


def test_token_chunk_carries_errors():
    chunk = scheduler_pb2.DESCRIPTOR.services_by_name["SchedulerService"]
    assert chunk.methods_by_name["Generate"].server_streaming
    err = common_pb2.TokenChunk(request_id="x", finished=True,
                                finish_reason=common_pb2.FINISH_REASON_ERROR,
                                error=common_pb2.ErrorDetail(code=common_pb2.ERROR_CODE_PROMPT_TOO_LONG,
                                                             message="too long", field="prompt"))
    assert common_pb2.TokenChunk.FromString(err.SerializeToString()).error.field == "prompt"
