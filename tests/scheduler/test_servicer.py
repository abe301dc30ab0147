"""One scenario, three fronts: the in-process AsyncEngine and the gRPC AsyncClient, a stream
per request or all on one multiplexed stream, must behave alike (the REST gateway runs
unchanged over any)."""
from __future__ import annotations

import asyncio
import time

import grpc

import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from lenserve.client import AsyncClient, Client
from lenserve.engine.llm_engine import EngineConfig, LLMEngine
from lenserve_contract.errors import InvalidRequestError
from lenserve_contract.sampling_params import SamplingParams
from services.executor.fake import FakeExecutor
from services.scheduler.async_engine import AsyncEngine
from services.scheduler.scheduler import SchedulerStats
from services.scheduler.servicer import SERVICE_NAME, build_server, mark_serving

CONFIG = EngineConfig(model="fake", block_size=4, num_gpu_blocks=64, max_model_len=128)
GREEDY = dict(temperature=0)


async def start_server(engine: AsyncEngine, port: int = 0):
    server, port = build_server(engine, f"127.0.0.1:{port}")
    await server.start()
    await mark_serving(server)
    return server, f"127.0.0.1:{port}"


@pytest.fixture
async def served():
    engine = AsyncEngine(CONFIG)
    server, target = await start_server(engine)
    yield engine, target
    await server.stop(grace=1)
    engine.shutdown()


@pytest.fixture(params=["engine", "grpc", "grpc-multiplexed"])
async def front(request, served):
    engine, target = served
    if request.param == "engine":
        yield engine
        return
    client = AsyncClient(target, multiplex=request.param == "grpc-multiplexed")
    yield client
    await client.close()


def slow_iterations(engine: AsyncEngine, monkeypatch) -> None:
    """2 ms an iteration: the fake model would otherwise finish all its tokens before an abort
    (or a second request) can travel, a race under load."""
    execute = engine.engine.executor.execute

    def slow_execute(batch):
        time.sleep(0.002)
        return execute(batch)

    monkeypatch.setattr(engine.engine.executor, "execute", slow_execute)


async def collect(front, prompt, request_id=None, **params):
    tokens, text, outs = [], "", []
    async for out in front.generate(prompt, SamplingParams(**params), request_id):
        tokens += out.outputs[0].token_ids
        text += out.outputs[0].text
        outs.append(out)
    return tokens, text, outs


def offline(prompts, **params):
    engine = LLMEngine(CONFIG)
    for i, p in enumerate(prompts):
        engine.add_request(f"s{i}", prompt=p, sampling_params=SamplingParams(**params))
    done = {}
    while engine.has_unfinished_requests():
        done.update({o.request_id: o for o in engine.step() if o.finished})
    return done


async def test_streams_match_offline_generation(front):
    prompts = [f"stream {i} " * (i + 1) for i in range(4)]
    results = await asyncio.gather(*(collect(front, p, f"s{i}", max_tokens=8, **GREEDY)
                                     for i, p in enumerate(prompts)))
    expected = offline(prompts, max_tokens=8, **GREEDY)
    for i, (tokens, text, outs) in enumerate(results):
        final = expected[f"s{i}"]
        assert (tokens, text) == (final.outputs[0].token_ids, final.outputs[0].text)
        assert outs[-1].finished and outs[-1].outputs[0].finish_reason == "length"
        assert not any(o.finished for o in outs[:-1])
        assert all(o.prompt_token_ids == final.prompt_token_ids for o in outs)


async def test_stop_string_reports_its_reason(front):
    full, _, _ = await collect(front, "abc", max_tokens=20, **GREEDY)
    text = "".join(chr(t) for t in full)
    _, got, outs = await collect(front, "abc", max_tokens=20, stop=[text[5:7]], **GREEDY)
    assert got == text[:text.find(text[5:7])]
    assert (outs[-1].outputs[0].finish_reason, outs[-1].outputs[0].stop_reason) == ("stop",
                                                                                    text[5:7])


async def test_bad_input_raises_invalid_request_with_its_field(front):
    with pytest.raises(InvalidRequestError, match="empty") as err:
        await collect(front, "")
    assert err.value.field == "prompt"
    with pytest.raises(InvalidRequestError, match="temperature"):
        await collect(front, "hi", temperature=-1.0)
    tokens, _, _ = await collect(front, "still serving", max_tokens=3)
    assert len(tokens) == 3


async def test_abort_and_early_close_end_requests(front, served, monkeypatch):
    slow_iterations(served[0], monkeypatch)
    stream = front.generate("abort me", SamplingParams(max_tokens=500, ignore_eos=True,
                                                              cap_max_tokens=True), "ab")
    first = await stream.__anext__()
    assert not first.finished and await front.abort("ab")
    rest = [out async for out in stream]
    assert rest[-1].finished and rest[-1].outputs[0].finish_reason == "abort"
    assert not await front.abort("ab")
    early = SamplingParams(max_tokens=500, cap_max_tokens=True)
    async for _ in front.generate("closed early", early, "early"):
        break                                   # the caller walks away: the request is aborted
    for _ in range(100):
        stats = await front.stats()
        if stats.num_running == stats.num_waiting == 0:
            break
        await asyncio.sleep(0.02)
    assert isinstance(stats, SchedulerStats) and stats.policy == "vllm"
    assert (stats.num_running, stats.num_waiting, stats.num_free_blocks) == (0, 0, 64)


async def test_health_and_malformed_bytes(served):
    _, target = served
    async with grpc.aio.insecure_channel(target) as channel:
        resp = await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=SERVICE_NAME))
        assert resp.status == health_pb2.HealthCheckResponse.SERVING
        for method, kind in (("Generate", channel.unary_stream), ("Abort", channel.unary_unary),
                             ("Subscribe", channel.unary_stream),
                             ("Submit", channel.unary_unary)):
            with pytest.raises(grpc.aio.AioRpcError) as err:
                call = kind(f"/{SERVICE_NAME}/{method}")(b"\xff\xff\xff\xff", timeout=5)
                await (call.read() if kind == channel.unary_stream else call)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


@pytest.mark.parametrize("multiplex", [False, True])
async def test_deadline_aborts_the_request(served, monkeypatch, multiplex):
    engine, target = served
    # The fake model is instant: 120 of its iterations can finish inside the deadline on a
    # fast machine. A millisecond per iteration keeps the request running past it.
    real_execute = FakeExecutor.execute

    def slow_execute(self, batch):
        time.sleep(0.001)
        return real_execute(self, batch)

    monkeypatch.setattr(FakeExecutor, "execute", slow_execute)
    async with AsyncClient(target, multiplex=multiplex) as client:
        stream = client.generate("slow", SamplingParams(max_tokens=120, ignore_eos=True),
                                 timeout_s=0.01)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await _consume(stream)
        assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    for _ in range(100):
        if (await engine.stats()).num_running == 0:
            break
        await asyncio.sleep(0.02)
    assert (await engine.stats()).num_free_blocks == 64


async def _consume(stream):
    return [out async for out in stream]


@pytest.mark.parametrize("multiplex", [False, True])
async def test_client_retries_until_the_scheduler_is_up(multiplex):
    from tests.predictor.conftest import free_port

    port = free_port()
    engine = AsyncEngine(CONFIG)

    async def start_late():
        await asyncio.sleep(0.3)
        return await start_server(engine, port)

    late = asyncio.create_task(start_late())
    async with AsyncClient(f"127.0.0.1:{port}", retries=6, backoff_s=0.1,
                           multiplex=multiplex) as client:
        tokens, _, _ = await collect(client, "hello", max_tokens=4)
    server, _ = await late
    assert len(tokens) == 4
    await server.stop(grace=1)
    engine.shutdown()


async def test_sync_client_streams_the_same_tokens(served):
    _, target = served
    expected = offline(["sync"], max_tokens=6, **GREEDY)["s0"].outputs[0]
    with Client(target) as client:   # called off the loop, which keeps serving
        out = await asyncio.to_thread(client.generate_all, "sync",
                                      SamplingParams(max_tokens=6, **GREEDY))
        stats = await asyncio.to_thread(client.stats)
    assert (out.outputs[0].token_ids, out.outputs[0].text) == (expected.token_ids, expected.text)
    assert out.finished and stats.num_finished >= 1


async def test_the_prediction_source_crosses_the_wire():
    """The gateway's per-source prediction counts need it on the gRPC side too."""
    engine = AsyncEngine(EngineConfig(model="fake", block_size=4, num_gpu_blocks=64,
                                      max_model_len=128, predictor="oracle"))
    server, target = await start_server(engine)
    try:
        async with AsyncClient(target) as client:
            outs = [out async for out in client.generate(
                "how long?", SamplingParams(max_tokens=5, ignore_eos=True), "p1")]
        assert outs[-1].finished
        assert outs[-1].metrics.prediction_source == "oracle"
        assert outs[-1].metrics.predicted_output_len == 5
    finally:
        await server.stop(grace=1)
        engine.shutdown()


async def test_a_subscription_carries_each_iteration_of_all_its_requests_in_one_message(
        served, monkeypatch):
    from lenserve_contract.proto import common_pb2, scheduler_pb2, scheduler_pb2_grpc

    engine, target = served
    slow_iterations(engine, monkeypatch)  # r0 still runs when its id is submitted again
    async with grpc.aio.insecure_channel(target) as channel:
        stub = scheduler_pb2_grpc.SchedulerServiceStub(channel)
        sub = stub.Subscribe(scheduler_pb2.SubscribeRequest(subscriber_id="s1"))
        assert not (await sub.read()).chunks              # open
        params = common_pb2.SamplingParams(max_tokens=40, ignore_eos=True)
        for i in range(4):
            await stub.Submit(scheduler_pb2.SubmitRequest(subscriber_id="s1", request=(
                common_pb2.Request(request_id=f"r{i}", prompt=f"p{i}", sampling_params=params))))
        with pytest.raises(grpc.aio.AioRpcError) as err:       # unknown subscription
            await stub.Submit(scheduler_pb2.SubmitRequest(subscriber_id="nope", request=(
                common_pb2.Request(request_id="x", prompt="p", sampling_params=params))))
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        with pytest.raises(grpc.aio.AioRpcError) as err:       # an id already running
            await stub.Submit(scheduler_pb2.SubmitRequest(subscriber_id="s1", request=(
                common_pb2.Request(request_id="r0", prompt="p", sampling_params=params))))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        tokens: dict[str, int] = {}
        widest = 0
        while len([r for r, n in tokens.items() if n == 40]) < 4:
            step = await sub.read()
            widest = max(widest, len({c.request_id for c in step.chunks}))
            for c in step.chunks:       # the prompt's ids come with the first chunk only
                assert bool(c.prompt_token_ids) == (c.request_id not in tokens)
                tokens[c.request_id] = c.num_output_tokens
        sub.cancel()
    assert tokens == {f"r{i}": 40 for i in range(4)}
    assert widest == 4                    # the four requests' tokens came in one message


async def test_closing_a_multiplexed_client_aborts_its_requests(served, monkeypatch):
    engine, target = served
    slow_iterations(engine, monkeypatch)
    client = AsyncClient(target, multiplex=True)
    streams = [client.generate(f"long {i}", SamplingParams(max_tokens=500, ignore_eos=True,
                                                              cap_max_tokens=True))
               for i in range(3)]
    for stream in streams:
        assert not (await stream.__anext__()).finished
    await client.close()                  # the subscription goes: its requests are aborted
    for stream in streams:
        with pytest.raises(ConnectionError):
            await _consume(stream)
    for _ in range(100):
        stats = await engine.stats()
        if stats.num_running == stats.num_waiting == 0:
            break
        await asyncio.sleep(0.02)
    assert (stats.num_running, stats.num_waiting, stats.num_free_blocks) == (0, 0, 64)


async def test_a_multiplexed_client_fails_fast_then_resubscribes_when_the_scheduler_restarts(
        monkeypatch):
    from tests.predictor.conftest import free_port

    port = free_port()
    engine = AsyncEngine(CONFIG)
    slow_iterations(engine, monkeypatch)
    server, target = await start_server(engine, port)
    async with AsyncClient(target, multiplex=True, retries=6, backoff_s=0.1) as client:
        assert len((await collect(client, "before", max_tokens=3))[0]) == 3
        running = client.generate("cut off", SamplingParams(max_tokens=500, ignore_eos=True,
                                                              cap_max_tokens=True))
        assert not (await running.__anext__()).finished
        await server.stop(grace=None)
        engine.shutdown()
        with pytest.raises((grpc.aio.AioRpcError, ConnectionError)):
            await asyncio.wait_for(_consume(running), 10)     # an error, not a hang
        engine = AsyncEngine(CONFIG)
        server, _ = await start_server(engine, port)
        assert len((await collect(client, "after", max_tokens=3))[0]) == 3
    await server.stop(grace=1)
    engine.shutdown()


async def test_a_subscription_the_scheduler_does_not_know_is_opened_again(served):
    """As after a scheduler restart that the client's stream has not noticed yet."""
    _, target = served
    async with AsyncClient(target, multiplex=True, backoff_s=0.01) as client:
        assert len((await collect(client, "first", max_tokens=2))[0]) == 2
        live = client._mux.subscriber_id
        client._mux.subscriber_id = "forgotten"
        assert len((await collect(client, "second", max_tokens=2))[0]) == 2
        assert client._mux.subscriber_id not in (live, "forgotten")


async def test_an_engine_failure_ends_each_multiplexed_request_with_an_error(served,
                                                                             monkeypatch):
    engine, target = served
    step = engine.engine.step
    broken = {"on": True}

    def failing_step():
        if broken["on"]:
            raise RuntimeError("engine bug")
        return step()

    monkeypatch.setattr(engine.engine, "step", failing_step)
    async with AsyncClient(target, multiplex=True) as client:
        _, _, outs = await asyncio.wait_for(collect(client, "doomed", max_tokens=4), 10)
        assert outs[-1].finished and outs[-1].outputs[0].finish_reason == "error"
        assert "engine bug" in outs[-1].error
        broken["on"] = False                    # the loop goes on for the next requests
        assert len((await collect(client, "fine", max_tokens=3))[0]) == 3
