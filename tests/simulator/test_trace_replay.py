"""Replaying a trace ends each reply at its recorded length without telling the policy.

A length-aware policy caps its prediction at the request's ``max_tokens``; a benchmark that
forced lengths with ``max_tokens`` = the trace's length (as ``vllm bench serve`` does) handed
every policy the true length of each reply it over-predicted. The benchmarks send no cap of
their own (the context the prompt leaves) and end the request at ``true_output_len`` as the
model's end-of-sequence token would.
"""
from lenserve.bench.backends.base import trace_params
from lenserve.bench.simulation import simulate
from lenserve_contract.sampling_params import SamplingParams
from services.scheduler.policies.alise import AlisePolicy
from services.scheduler.policies.length_stats import max_output_len
from tests.engine.engine_helpers import make_engine, run_to_completion
from tests.simulator.sim_helpers import make_spec, make_target, workload


def test_a_traced_request_ends_at_its_length_with_stop_and_max_tokens_still_caps_it():
    engine = make_engine("vllm", max_model_len=64)
    engine.add_request("traced", prompt_token_ids=[5] * 8, true_output_len=5,
                       sampling_params=trace_params(64))
    engine.add_request("capped", prompt_token_ids=[5] * 8, true_output_len=9,
                       sampling_params=SamplingParams(max_tokens=3, ignore_eos=True))
    outs = run_to_completion(engine)
    traced, capped = outs["traced"].outputs[0], outs["capped"].outputs[0]
    assert len(traced.token_ids) == 5 and traced.finish_reason == "stop"
    assert len(capped.token_ids) == 3 and capped.finish_reason == "length"


class _Seen(AlisePolicy):
    """ALISE recording the most output any request could produce, as it ranks them."""

    caps: dict[str, int] = {}

    def add_request(self, request):
        _Seen.caps[request.request_id] = max_output_len(request, self.config.max_model_len)
        super().add_request(request)


def test_the_simulated_policy_never_sees_the_trace_length(monkeypatch):
    import services.scheduler.policies as policies
    monkeypatch.setitem(policies.POLICIES, "alise", _Seen)
    _Seen.caps = {}
    spec = make_spec("alise", make_target(num_gpu_blocks=64, block_size=4), max_model_len=128)
    run = simulate(spec, workload((8, 3, 0.0), (8, 40, 0.0), (20, 7, 0.1)), 1.0, False)
    assert [r.num_output_tokens for r in run.records] == [3, 40, 7]
    # Each cap is the context the prompt leaves, not the reply's length.
    assert sorted(_Seen.caps.values()) == [108, 120, 120]
