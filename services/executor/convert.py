"""ExecutorInput / ExecutorOutput to and from ``executor.proto`` (field for field)."""
from __future__ import annotations

import dataclasses

from lenserve_contract.convert import sampling_params_from_proto, sampling_params_to_proto
from lenserve_contract.proto import executor_pb2 as pb
from services.executor.types import (
    ExecutorInput,
    ExecutorOutput,
    IterationTimings,
    ModelInfo,
    ScheduledSequence,
)


def input_to_proto(batch: ExecutorInput) -> pb.ExecuteRequest:
    return pb.ExecuteRequest(
        iteration=batch.iteration,
        sequences=[_seq_to_proto(s) for s in batch.sequences],
        copy_blocks=_moves(batch.copy_blocks), swap_in=_moves(batch.swap_in),
        swap_out=_moves(batch.swap_out), swap_shm_name=batch.swap_buffer,
        finished_request_ids=batch.finished_request_ids,
        waves=[pb.Wave(sequence_indices=w) for w in batch.waves or ()])


def input_from_proto(msg: pb.ExecuteRequest) -> ExecutorInput:
    return ExecutorInput(
        iteration=msg.iteration, sequences=[_seq_from_proto(s) for s in msg.sequences],
        copy_blocks=_pairs(msg.copy_blocks), finished_request_ids=list(msg.finished_request_ids),
        waves=[list(w.sequence_indices) for w in msg.waves] or None,
        swap_out=_pairs(msg.swap_out), swap_in=_pairs(msg.swap_in), swap_buffer=msg.swap_shm_name)


def output_to_proto(out: ExecutorOutput) -> pb.ExecuteResponse:
    t = out.timings
    return pb.ExecuteResponse(
        iteration=out.iteration,
        sampled=[_sampled(out, rid, tok) for rid, tok in out.sampled.items()],
        timings=pb.IterationTimings(forward_s=t.forward_s, attention_s=t.attention_s,
                                    sample_s=t.sample_s, total_s=t.total_s, swap_s=t.swap_s,
                                    wave_attention_s=t.wave_attention_s))


def output_from_proto(msg: pb.ExecuteResponse) -> ExecutorOutput:
    t = msg.timings
    timings = IterationTimings(t.forward_s, t.attention_s, t.sample_s, t.total_s, t.swap_s,
                               list(t.wave_attention_s))
    top = {s.request_id: list(zip(s.top_token_ids, s.top_logprobs))
           for s in msg.sampled if s.has_logprobs}
    return ExecutorOutput(msg.iteration, {s.request_id: s.token_id for s in msg.sampled},
                          {s.request_id: s.logprob for s in msg.sampled}, timings, top)


def _sampled(out: ExecutorOutput, rid: str, token: int) -> pb.SampledToken:
    msg = pb.SampledToken(request_id=rid, token_id=token, logprob=out.logprobs.get(rid, 0.0))
    top = out.top_logprobs.get(rid)
    if top is not None:
        msg.has_logprobs = True
        msg.top_token_ids.extend(t for t, _ in top)
        msg.top_logprobs.extend(lp for _, lp in top)
    return msg


def _seq_to_proto(s: ScheduledSequence) -> pb.ScheduledSequence:
    return pb.ScheduledSequence(
        request_id=s.request_id, token_ids=s.token_ids, num_computed_tokens=s.num_computed_tokens,
        block_table=s.block_table, sample=s.sample,
        sampling_params=sampling_params_to_proto(s.sampling_params),
        num_output_tokens=s.num_output_tokens, block_table_is_delta=s.block_table_is_delta,
        context_token_ids=s.context_token_ids,
        host_block_table=s.host_block_table or [], streamed=s.host_block_table is not None)


def _seq_from_proto(m: pb.ScheduledSequence) -> ScheduledSequence:
    return ScheduledSequence(m.request_id, list(m.token_ids), m.num_computed_tokens,
                             list(m.block_table), m.sample,
                             sampling_params_from_proto(m.sampling_params), m.num_output_tokens,
                             m.block_table_is_delta, list(m.context_token_ids),
                             list(m.host_block_table) if m.streamed else None)


def _moves(pairs: list[tuple[int, int]]) -> list[pb.BlockMove]:
    return [pb.BlockMove(src=a, dst=b) for a, b in pairs]


def _pairs(moves) -> list[tuple[int, int]]:
    return [(m.src, m.dst) for m in moves]


def model_info_to_proto(info: ModelInfo) -> pb.ModelInfo:
    return pb.ModelInfo(**dataclasses.asdict(info))


def model_info_from_proto(msg: pb.ModelInfo) -> ModelInfo:
    fields = {f.name: getattr(msg, f.name) for f in dataclasses.fields(ModelInfo)}
    fields["eos_token_id"] = msg.eos_token_id if msg.HasField("eos_token_id") else None
    fields["eos_token_ids"] = tuple(msg.eos_token_ids)
    return ModelInfo(**fields)
