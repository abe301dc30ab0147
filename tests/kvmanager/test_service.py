"""The kvmanager service: the serving core swapping through it gives the tokens it gives with no
swaps, the processes start from the CLI and stop cleanly, bad input and malformed bytes are
refused without a traceback, and a kvmanager that is gone is reported as such."""
from __future__ import annotations

import logging
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from lenserve_contract.errors import InvalidRequestError
from lenserve_contract.proto import executor_pb2, executor_pb2_grpc
from lenserve_contract.sampling_params import SamplingParams
from services import shm
from services.executor.client import ExecutorClient
from services.executor.fake import FakeExecutor
from services.kvmanager.__main__ import add_arguments, config_from_args
from services.kvmanager.client import KVManagerClient, KVManagerUnavailableError
from services.kvmanager.config import KVManagerConfig
from services.kvmanager.servicer import SERVICE_NAME
from services.scheduler.engine_core import EngineCore
from services.scheduler.policies import POLICIES
from services.scheduler.wiring import EngineConfig, scheduler_config
from tests.kvmanager.remote import KVManagerStack
from tests.swap_policies import RandomSwapPolicy as EngineRandomSwapPolicy

ROOT = Path(__file__).resolve().parents[2]
HOST_GIB = 2048 / 2**30      # 32 host blocks of the fake executor (64 bytes each)


class RandomSwapPolicy(EngineRandomSwapPolicy):
    """vLLM plus random swaps (the engine tests' policy), under its own name and seed."""

    name = "test-service-random-swap"
    seed = 3


def fake_executor() -> FakeExecutor:
    return FakeExecutor(num_gpu_blocks=20, block_size=4, max_model_len=64)


def run_engine(executor, kv_manager, policy: str) -> dict[str, list[int]]:
    config = EngineConfig(model="fake", policy=policy, max_model_len=64,
                          max_num_batched_tokens=24, max_num_seqs=6)
    engine = EngineCore(scheduler_config(config, executor), executor, kv_manager=kv_manager,
                        check_integrity=True)
    rng = random.Random(0)
    for i in range(16):
        prompt = [rng.randrange(32, 127) for _ in range(rng.randint(1, 20))]
        engine.add_request(f"r{i}", prompt_token_ids=prompt, predicted_output_len=8,
                           sampling_params=SamplingParams(max_tokens=rng.randint(1, 24),
                                                          ignore_eos=True))
    done = {}
    for _ in range(5000):
        if not engine.has_unfinished_requests():
            break
        done.update((o.request_id, o) for o in engine.step() if o.finished)
    assert all(o.outputs[0].finish_reason == "length" for o in done.values()), done
    return {rid: o.outputs[0].token_ids for rid, o in done.items()}


def test_the_serving_core_swapping_through_the_service_keeps_every_token(monkeypatch):
    monkeypatch.setitem(POLICIES, RandomSwapPolicy.name, RandomSwapPolicy)
    reference = run_engine(fake_executor(), None, "vllm")
    stack = KVManagerStack(fake_executor(), KVManagerConfig(HOST_GIB))
    try:
        tokens = run_engine(stack.mover, stack.client, RandomSwapPolicy.name)
        stats = stack.client.stats()
    finally:
        stack.stop()
    assert tokens == reference and len(tokens) == 16
    assert stats.bytes_swapped_in > 0 and stats.num_swapped_requests == 0


def test_the_scheduler_learns_whether_copies_run_beside_the_compute():
    # On a CPU the copier's thread shares the executor's cores: the layout says so, through
    # the service as in process, and the serving core hands it to the policy.
    stack = KVManagerStack(fake_executor(), KVManagerConfig(HOST_GIB))
    try:
        assert stack.client.copies_overlap is False
        config = EngineConfig(model="fake", policy="fluidinfer", max_model_len=64)
        engine = EngineCore(scheduler_config(config, stack.mover), stack.mover,
                            kv_manager=stack.client)
        assert engine.scheduler.state.copies_overlap is False
    finally:
        stack.stop()
    engine = EngineCore(scheduler_config(config, fake_executor()), fake_executor())
    assert engine.scheduler.state.copies_overlap        # no host tier: nothing to hold back


def test_malformed_bytes_are_invalid_argument_without_a_traceback(caplog):
    stack = KVManagerStack(fake_executor(), KVManagerConfig(HOST_GIB))
    caplog.set_level(logging.DEBUG)
    try:
        with grpc.insecure_channel(stack.kvmanager.target) as channel:
            for method in ("SwapOut", "SwapIn", "WaitSwap", "Free", "GetStats", "Reset"):
                raw = channel.unary_unary(f"/{SERVICE_NAME}/{method}")
                with pytest.raises(grpc.RpcError) as err:
                    raw(b"\xff\xff\xff\xff", timeout=5)
                assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, method
                assert "malformed" in err.value.details()
            health = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=SERVICE_NAME), timeout=5)
            assert health.status == health_pb2.HealthCheckResponse.SERVING
        assert stack.client.stats().num_host_blocks == 32       # still serving
    finally:
        stack.stop()
    assert not [r for r in caplog.records if r.exc_info or "Traceback" in r.getMessage()]


def test_a_block_move_naming_a_foreign_or_missing_segment_is_refused():
    stack = KVManagerStack(fake_executor(), KVManagerConfig(HOST_GIB))
    try:
        with grpc.insecure_channel(stack.executor.target) as channel:
            stub = executor_pb2_grpc.ExecutorServiceStub(channel)
            for name in ("../etc/passwd", "lenserve-kv-1-00ff", ""):
                with pytest.raises(grpc.RpcError) as err:
                    stub.ExportBlocks(executor_pb2.BlockDataRequest(block_ids=[0],
                                                                    shm_name=name), timeout=5)
                assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, name
        with pytest.raises(InvalidRequestError, match="unknown"):
            stack.mover.export_blocks([99])
    finally:
        stack.stop()


def test_bad_wire_values_are_refused_before_any_call():
    stack = KVManagerStack(fake_executor(), KVManagerConfig(HOST_GIB))
    try:
        with pytest.raises(InvalidRequestError, match="device_blocks|unknown"):
            stack.client.swap_out("a", [2**40])
        with pytest.raises(InvalidRequestError, match="num_tokens"):
            stack.client.swap_out("a", [1], num_tokens="4")
        assert stack.client.num_free_host_blocks() == 32
    finally:
        stack.stop()


def test_a_kvmanager_that_is_gone_is_reported_clearly():
    stack = KVManagerStack(fake_executor(), KVManagerConfig(HOST_GIB), timeout_s=2)
    stack.kvmanager.stop()
    try:
        with pytest.raises(KVManagerUnavailableError, match="kvmanager at 127.0.0.1.*UNAVAILABLE"):
            stack.client.swap_out("a", [0])
    finally:
        stack.client.close()        # nothing to free on a service that is gone
        stack.mover.close()
        stack.executor.stop()


def test_the_config_comes_from_flags_and_env(monkeypatch):
    import argparse
    monkeypatch.setenv("LENSERVE_KV_INT8", "1")
    monkeypatch.setenv("LENSERVE_KVMANAGER_PORT", "6001")
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    config = config_from_args(parser.parse_args(["--swap-space", "0.5",
                                                 "--executor", "grpc://h:1"]))
    assert (config.kv.swap_space_gib, config.kv.int8, config.port) == (0.5, True, 6001)
    with pytest.raises(ValueError, match="grpc://"):
        config_from_args(parser.parse_args(["--executor", "h:1"]))
    with pytest.raises(ValueError, match="swap_space_gib"):
        config_from_args(parser.parse_args(["--swap-space", "-1"]))


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(*argv: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-m", *argv], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _stop(proc: subprocess.Popen) -> str:
    proc.send_signal(signal.SIGTERM)
    try:
        out, _ = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
    return out


def test_executor_and_kvmanager_processes_move_blocks_through_shared_memory(monkeypatch):
    """Separate processes: the bytes cross a process boundary only through /dev/shm."""
    monkeypatch.setitem(POLICIES, RandomSwapPolicy.name, RandomSwapPolicy)
    ex_port, kv_port = _free_port(), _free_port()
    executor = _start("services.executor", "--model", "fake", "--num-gpu-blocks", "20",
                      "--block-size", "4", "--max-model-len", "64", "--port", str(ex_port))
    kvmanager = _start("services.kvmanager", "--executor", f"grpc://127.0.0.1:{ex_port}",
                       "--swap-space", str(HOST_GIB), "--port", str(kv_port))
    client = mover = None
    try:
        mover = ExecutorClient(f"grpc://127.0.0.1:{ex_port}")
        client = KVManagerClient(f"grpc://127.0.0.1:{kv_port}")
        reference = run_engine(fake_executor(), None, "vllm")
        assert run_engine(mover, client, RandomSwapPolicy.name) == reference
        assert client.stats().bytes_swapped_in > 0
    finally:
        for c in (client, mover):
            if c is not None:
                c.close()
        kv_log, ex_log = _stop(kvmanager), _stop(executor)
    assert kvmanager.returncode == 0 and executor.returncode == 0, kv_log + ex_log
    assert "Traceback" not in kv_log + ex_log, kv_log + ex_log
    assert not [p for p in shm.SHM_DIR.glob(f"{shm.PREFIX}{kvmanager.pid}-*")]


def test_tickets_are_bounded(monkeypatch):
    stack = KVManagerStack(fake_executor(), KVManagerConfig(HOST_GIB))
    stack.kvmanager.servicer.max_tickets = 4
    try:
        for i in range(10):                 # handles dropped unwaited
            stack.client.swap_out(f"r{i}", [i])
            time.sleep(0.01)
        stack.client.wait_all()
        assert len(stack.kvmanager.servicer._tickets) <= 4
        assert stack.client.stats().num_swapped_requests == 10
        stack.client.check_integrity()
    finally:
        stack.stop()


def test_a_restarted_scheduler_finds_the_pool_empty():
    stack = KVManagerStack(fake_executor(), KVManagerConfig(HOST_GIB))
    try:
        stack.client.swap_out("left-behind", [0, 1]).wait()
        again = KVManagerClient(f"grpc://{stack.kvmanager.target}")   # the scheduler restarts
        assert again.num_free_host_blocks() == 32 and not again.holds("left-behind")
        again.check_integrity()
        again.close()
    finally:
        stack.stop()


def test_a_kvmanager_that_dies_fails_only_the_requests_it_holds(monkeypatch):
    monkeypatch.setitem(POLICIES, RandomSwapPolicy.name, RandomSwapPolicy)
    stack = KVManagerStack(fake_executor(), KVManagerConfig(HOST_GIB), timeout_s=2)
    config = EngineConfig(model="fake", policy=RandomSwapPolicy.name, max_model_len=64,
                          max_num_batched_tokens=24, max_num_seqs=6)
    engine = EngineCore(scheduler_config(config, stack.mover), stack.mover,
                        kv_manager=stack.client)
    for i in range(8):
        engine.add_request(f"r{i}", prompt_token_ids=[40 + i] * 6,
                           sampling_params=SamplingParams(max_tokens=20, ignore_eos=True))
    done = {}
    try:
        for step in range(2000):
            if step == 6:
                stack.kvmanager.stop()      # the host tier dies mid-run
            if not engine.has_unfinished_requests():
                break
            done.update((o.request_id, o) for o in engine.step() if o.finished)
            engine.scheduler.check_integrity()
    finally:
        stack.client.close()
        stack.mover.close()
        stack.executor.stop()
    reasons = {o.outputs[0].finish_reason for o in done.values()}
    assert len(done) == 8 and reasons <= {"length", "error"} and "error" in reasons
    errors = [o.error for o in done.values() if o.outputs[0].finish_reason == "error"]
    assert all("kvmanager at 127.0.0.1" in e and "UNAVAILABLE" in e for e in errors), errors


def test_the_scheduler_takes_a_kvmanager_only_beside_a_remote_executor():
    from services.scheduler.__main__ import SchedulerServiceConfig
    engine = EngineConfig(model="fake")
    ok = SchedulerServiceConfig(engine, "grpc://h:1", kvmanager="grpc://h:2")
    assert ok.kvmanager == "grpc://h:2"
    with pytest.raises(ValueError, match="needs --executor grpc://"):
        SchedulerServiceConfig(engine, kvmanager="grpc://h:2")
    with pytest.raises(ValueError, match="grpc://HOST:PORT"):
        SchedulerServiceConfig(engine, "grpc://h:1", kvmanager="h:2")
    with pytest.raises(ValueError, match="kvmanager service"):
        SchedulerServiceConfig(EngineConfig(model="fake", swap_space_gib=1), "grpc://h:1")
