"""The in-process engine backend, on the engine's model-free executor."""
from __future__ import annotations

import dataclasses

import pytest

from lenserve.bench.backends import BackendOptions, create_backend, parse_backend_spec
from lenserve.bench.backends.lenserve_engine import LenserveBackend
from lenserve.bench.runner import RunnerConfig, replay
from lenserve.workloads.types import BenchRequest, Workload

from .fakes import make_workload

QUIET = RunnerConfig(show_progress=False)


@pytest.fixture
def backend():
    b = create_backend(parse_backend_spec("lenserve:vllm"), BackendOptions(model="fake"))
    b.start()
    yield b
    b.close()


def test_outputs_have_the_asked_lengths_and_engine_token_times(backend):
    workload = Workload("w", tuple(dataclasses.replace(r, output_len=n) for r, n in
                                   zip(make_workload([0.0, 0.0, 0.02]).requests, [1, 5, 9])))
    run = replay(backend, workload, QUIET)
    assert [r.num_output_tokens for r in run.records] == [1, 5, 9]
    for rec in run.records:
        assert rec.success
        assert rec.token_times == sorted(rec.token_times)
        assert rec.arrival_time <= rec.token_times[0] <= rec.finish_time


def test_a_refused_request_fails_alone(backend):
    bad = BenchRequest("bad", (5, 6, 99999), 4)       # token id outside the vocabulary
    good = make_workload([0.0]).requests[0]
    run = replay(backend, Workload("w", (bad, good)), QUIET)
    by_id = {r.request_id: r for r in run.records}
    assert not by_id["bad"].success and "prompt_token_ids" in by_id["bad"].error
    assert by_id["req-0"].success and by_id["req-0"].num_output_tokens == 3


def test_ids_repeat_safely_across_runs(backend):
    workload = make_workload([0.0, 0.0])
    assert all(r.success for r in replay(backend, workload, QUIET).records)
    assert all(r.success for r in replay(backend, workload, QUIET).records)


class DroppingEngine:
    """Accepts requests and then forgets them."""

    def add_request(self, *args, **kwargs):
        pass

    def has_unfinished_requests(self):
        return False

    def step(self):
        return []


def test_requests_the_engine_drops_fail_instead_of_hanging():
    backend = LenserveBackend("lenserve:vllm", "vllm", BackendOptions(), engine=DroppingEngine())
    (record,) = replay(backend, make_workload([0.0]), QUIET).records
    assert record.error == "the engine dropped the request"


def test_the_length_predictor_reads_the_decoded_prompt(tmp_path):
    """Requests go in as token ids; the embedded predictor must still see their text (as in
    ``lenserve simulate``), not an empty prompt."""
    import json

    from services.executor.fake import CharTokenizer

    tok = CharTokenizer()
    texts = ["write a long essay about rivers", "say yes", "list ten fruits", "hello there"]
    seed = tmp_path / "seed.jsonl"
    seed.write_text("".join(json.dumps({"prompt": t, "output_len": 5 + 10 * i}) + "\n"
                            for i, t in enumerate(texts)))
    requests = tuple(BenchRequest(f"r{i}", tuple(tok.encode(t)), 3, 0.0)
                     for i, t in enumerate(texts))
    b = create_backend(parse_backend_spec("lenserve:alise"),
                       BackendOptions(model="fake", predictor="embedded",
                                      predictor_seed=str(seed)))
    b.start()
    asked = []
    pump = b.engine.predictions
    submit = pump.submit
    pump.submit = lambda rid, query: (asked.append(query.prompt), submit(rid, query))
    try:
        run = replay(b, Workload("w", requests), QUIET)
    finally:
        b.close()
    assert all(r.success for r in run.records)
    assert asked == texts
