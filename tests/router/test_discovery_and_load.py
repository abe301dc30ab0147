"""Where replicas come from (a static list, a DNS name followed over time) and what a replica
reports (its load: the work its requests still need, by their predicted lengths)."""
from __future__ import annotations

import asyncio

import pytest

from lenserve_contract.sampling_params import SamplingParams
from services.router import discovery
from services.router.__main__ import config_from_args, main
from services.router.core import RouterCore
from services.router.runtime import Router
from services.executor.fake import FakeExecutor
from services.scheduler.engine_core import EngineCore
from services.scheduler.load import replica_load
from services.scheduler.policies.time_model import ExecutionTimeModel
from services.scheduler.wiring import EngineConfig, engine_parts


@pytest.mark.parametrize("text, message", [
    ("", "names no replica"), ("host", "not HOST:PORT"), ("a:1,dns://b:2", "stands alone")])
def test_bad_replica_lists_are_refused_with_the_reason(text, message):
    with pytest.raises(ValueError, match=message):
        discovery.parse_replicas(text)


def test_the_router_command_refuses_a_bad_config_with_exit_2(capsys):
    assert main(["--replicas", "nohost"]) == 2
    assert "not HOST:PORT" in capsys.readouterr().err


async def test_a_dns_name_resolves_to_one_replica_per_address():
    assert await discovery.resolve("dns://localhost:50051") in (
        ["127.0.0.1:50051"], ["127.0.0.1:50051", "[::1]:50051"], ["[::1]:50051"])


async def test_replicas_follow_the_dns_answer_and_a_failed_lookup_keeps_the_last(monkeypatch):
    answers = [["10.0.0.1:1", "10.0.0.2:1"], OSError("no answer"), ["10.0.0.2:1"]]

    async def resolve(target):
        answer = answers.pop(0) if answers else ["10.0.0.2:1"]
        if isinstance(answer, Exception):
            raise answer
        return answer

    monkeypatch.setattr(discovery, "resolve", resolve)
    router = Router(RouterCore("least-loaded"))
    seen = []

    def apply(names):
        seen.append(list(names))
        router.set_replicas(names)

    task = asyncio.ensure_future(discovery.follow(("dns://replicas:1",), apply, 0.01))
    while answers:
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.03)
    task.cancel()
    assert seen[0] == ["10.0.0.1:1", "10.0.0.2:1"] and seen[1] == ["10.0.0.2:1"]
    assert list(router.core.replicas) == ["10.0.0.2:1"]      # the one gone is forgotten
    await router.close()


def test_a_static_list_is_applied_once_and_the_config_is_frozen():
    import argparse
    from services.router.__main__ import add_arguments
    p = argparse.ArgumentParser()
    add_arguments(p)
    config = config_from_args(p.parse_args(["--replicas", "a:1,b:2", "--policy", "round-robin"]))
    assert config.replicas == ("a:1", "b:2") and config.policy == "round-robin"
    with pytest.raises(AttributeError):
        config.policy = "least-loaded"      # type: ignore[misc]


def _engine() -> EngineCore:
    config = EngineConfig(model="fake", block_size=4, num_gpu_blocks=64, max_model_len=128,
                          max_num_seqs=1)
    # Iterations the fake model times at 1 ms plus 0.1 ms a token: the time model fits them.
    executor = FakeExecutor(cost_per_iteration_s=1e-3, cost_per_token_s=1e-4)
    return EngineCore(**engine_parts(config, executor),
                      time_model=ExecutionTimeModel(min_samples=4, refit_every=1))


def test_a_replica_reports_the_work_its_requests_still_need_by_predicted_length():
    engine = _engine()
    params = SamplingParams(max_tokens=50, ignore_eos=True)
    engine.add_request("long", prompt_token_ids=[5] * 10, sampling_params=params,
                       predicted_output_len=40)
    engine.add_request("short", prompt_token_ids=[5] * 6, sampling_params=params,
                       predicted_output_len=3)
    load = replica_load(engine)
    assert (load.queued_prefill_tokens, load.remaining_decode_tokens) == (16, 43)
    for _ in range(6):              # one at a time: "long" runs, "short" waits
        engine.step()
    load = replica_load(engine)
    assert load.stats.num_running == 1 and load.stats.num_waiting == 1
    assert load.queued_prefill_tokens == 6 and load.remaining_decode_tokens == 43 - 6
    assert load.rates is not None   # the replica's own time model, fitted from its iterations
    engine.add_request("unknown", prompt_token_ids=[5] * 4, sampling_params=params)
    assert replica_load(engine, default_output_len=100).num_unpredicted == 1
