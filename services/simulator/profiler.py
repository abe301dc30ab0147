"""Measuring the real executor's iteration time over a grid of batches.

A batch is built by hand (as ``lenserve bench-executor`` does): each sequence gets its own
blocks of the executor's default KV pool, so the grid never asks for more KV than the engine
would have on this device. Attention cost depends on lengths, not on the KV values."""
from __future__ import annotations

import platform
import random
import time
from collections import Counter
from collections.abc import Callable, Iterable
from datetime import datetime, timezone

import torch

from lenserve_contract.sampling_params import SamplingParams
from services.executor.runner import InProcessExecutor
from services.executor.types import ExecutorInput, ScheduledSequence
from services.kvmanager.config import GIB, KVManagerConfig
from services.kvmanager.core import InProcessKVManager
from services.kvmanager.host_pool import host_block_bytes
from services.kvmanager.host_store import BlockLayout
from services.simulator.profile_file import Profile, ProfilePoint, SwapPoint
from services.simulator.shapes import ModelShape

GREEDY = SamplingParams(temperature=0.0)
# Hinges of the fitted cost model on the tokens fed (piecewise-linear): one at every count up
# to SMALL_BATCH, where the dense layers' time is not smooth in the rows they multiply, then
# 128 and 512, where prefill turns compute-bound. Measured on opt-125m, float32, 1 thread: one
# decode runs as a matrix-vector product (35 ms) and two already cost 63 ms, while three cost
# 81 ms, four 71 ms and five to seven more than eight. A model with hinges at 2, 4 and 16 only
# put three decodes at 63 ms, and low-load runs, whose batches hold two to seven requests, came
# out 9-17% faster in the simulator than on the engine. A profile keeps the knots it was fitted
# with, so older profiles read as before.
SMALL_BATCH = 16
KNOTS = tuple(range(2, SMALL_BATCH + 1)) + (128, 512)
Group = tuple[int, int, int]     # (count, tokens fed each, computed each)


def grid(max_tokens: int, kv_tokens: int, max_len: int, large: bool) -> list[tuple[Group, ...]]:
    """Prefill-only, decode-only and mixed batches within the token budget and the KV pool."""
    scale = 4 if large else 1
    prefill = [((1, p, 0),) for p in (16, 64, 256, 512, 1024, 2048 * scale)]
    prefill += [((4, 256, 0),), ((8, 128, 0),), ((1, 512, 1024),), ((2, 256, 768),)]
    # Short contexts too, so that large decode batches fit a small (CPU) pool: a workload of
    # short requests runs batches past 64 sequences that the cost model must not extrapolate.
    decode = [((d, 1, c - 1),) for d in (1, 2, 4, 8, 16, 32, 64 * scale, 128 * scale,
                                          256 * scale)
              for c in (64, 128, 512, 1024)]
    # Every small batch size once, so each hinge below SMALL_BATCH has a point of its own.
    timed = {count for ((count, _, _),) in decode}
    decode += [((d, 1, 63),) for d in range(1, SMALL_BATCH + 1) if d not in timed]
    mixed = [((1, 256, 0), (16, 1, 511)), ((1, 1024, 0), (8, 1, 255)),
             ((1, 128, 256), (32, 1, 127))]
    return [g for g in prefill + decode + mixed if _fits(g, max_tokens, kv_tokens, max_len)]


def _fits(groups: tuple[Group, ...], max_tokens: int, kv_tokens: int, max_len: int) -> bool:
    tokens = sum(c * q for c, q, _ in groups)
    kv = sum(c * (q + d) for c, q, d in groups)
    return tokens <= max_tokens and kv <= kv_tokens and all(q + d <= max_len
                                                             for _, q, d in groups)


def shape_of(executor: InProcessExecutor) -> ModelShape:
    info, cfg = executor.model_info(), executor.loaded.hf_config
    ffn = getattr(cfg, "ffn_dim", None) or getattr(cfg, "intermediate_size")
    return ModelShape(info.name, info.family, info.num_layers, int(cfg.hidden_size),
                      info.num_heads, info.num_kv_heads, info.head_dim, int(ffn),
                      info.vocab_size, info.max_model_len, info.dtype, info.eos_token_id,
                      ffn_matrices=3 if info.family == "llama" else 2)


class Profiler:
    def __init__(self, executor: InProcessExecutor, repeats: int = 3):
        self.executor = executor
        self.repeats = repeats
        self._calls = 0
        self._forget: list[str] = []
        gen = torch.Generator().manual_seed(0)
        self._tokens = torch.randint(1000, executor.model_info().vocab_size, (8192,),
                                     generator=gen).tolist()

    def measure(self, groups: tuple[Group, ...]) -> ProfilePoint:
        times = [self._time(groups) for _ in range(self.repeats + 1)]
        return ProfilePoint(groups, tuple(times[1:]))    # the first call warms up

    def _time(self, groups: tuple[Group, ...]) -> float:
        batch = self._batch(groups)
        start = time.perf_counter()
        self.executor.execute(batch)
        return time.perf_counter() - start

    def _batch(self, groups: tuple[Group, ...]) -> ExecutorInput:
        bs, seqs, next_block = self.executor.block_size, [], 0
        self._calls += 1
        for gi, (count, q, done) in enumerate(groups):
            need = -(-(q + done) // bs)
            for i in range(count):
                table = list(range(next_block, next_block + need))
                next_block += need
                seqs.append(ScheduledSequence(f"c{self._calls}g{gi}s{i}", self._tokens[:q],
                                              done, table, True, GREEDY))
        batch = ExecutorInput(self._calls, seqs, finished_request_ids=self._forget)
        self._forget = [s.request_id for s in seqs]
        return batch


SWAP_SIZES = (1, 4, 16, 64)     # blocks per swap: one request's KV, short to long


def measure_swaps(executor: InProcessExecutor, repeats: int = 3,
                  sizes: Iterable[int] = SWAP_SIZES) -> tuple[SwapPoint, ...]:
    """Seconds to swap a request's blocks out to the host tier and back, through the real KV
    manager (worker thread, staging, pinned memory on a GPU), as the engine pays them: each
    copy is started and waited for on its own. Blocks are scattered over the pool."""
    info = executor.model_info()
    sizes = [n for n in sizes if n <= info.num_gpu_blocks]
    space = max(sizes) * host_block_bytes(BlockLayout.from_model_info(info), False)
    manager = InProcessKVManager(KVManagerConfig(space / GIB), executor, info)
    gen = torch.Generator().manual_seed(0)
    points = []
    try:
        for n in sizes:
            out_s, in_s = [], []
            for i in range(repeats + 1):            # the first round warms up
                blocks = torch.randperm(info.num_gpu_blocks, generator=gen)[:n].tolist()
                out_s.append(_timed(manager.swap_out, f"swap{n}-{i}", blocks))
                in_s.append(_timed(manager.swap_in, f"swap{n}-{i}", blocks))
                manager.wait_all()
            points.append(SwapPoint(n, tuple(out_s[1:]), tuple(in_s[1:])))
    finally:
        manager.close()
    return tuple(points)


def _timed(start_copy, request_id: str, blocks: list[int]) -> float:
    began = time.perf_counter()
    start_copy(request_id, blocks).wait()
    return time.perf_counter() - began


class _Recording:
    """The executor as the serving core drives it, each call's batch and seconds noted."""

    def __init__(self, executor: InProcessExecutor):
        self._inner, self.calls = executor, []

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def execute(self, batch: ExecutorInput):
        start = time.perf_counter()
        out = self._inner.execute(batch)
        seconds = time.perf_counter() - start
        shapes = Counter((len(s.token_ids), s.num_computed_tokens) for s in batch.sequences
                         if s.sample)
        # A chunk that samples nothing is rare (a long prompt cut by the token budget): the
        # points store groups of sampled sequences, so such a batch is left out.
        if len(batch.sequences) == sum(shapes.values()):
            self.calls.append(ProfilePoint(tuple((n, q, done) for (q, done), n
                                                 in sorted(shapes.items())), (seconds,)))
        return out

    def close(self) -> None:       # the profile goes on with the executor (swaps)
        pass


def serving_pass(executor: InProcessExecutor, iterations: int, *, seed: int = 0,
                 progress: Callable[[Iterable], Iterable] = iter) -> list[ProfilePoint]:
    """Iterations of the real serving core (vLLM policy, chunked prefill) over random prompts of
    4-96 tokens and replies of 4-64, one arrival an iteration at most, the number of running
    requests wandering between 1 and SMALL_BATCH: one point per iteration, timed once.

    The grid times each batch on its own, back to back; in serving, consecutive iterations
    differ (a new prompt chunk, one more token of context each), and on the CPU of the fidelity
    runs the engine's iterations took a median 7.5% longer than grid points of the same batch.
    These points let the fit see that."""
    from services.scheduler.engine_core import EngineCore
    from services.scheduler.wiring import EngineConfig, engine_parts

    info = executor.model_info()
    recording = _Recording(executor)
    limit = min(info.max_model_len, 256)
    config = EngineConfig(model=info.name, block_size=info.block_size,
                          num_gpu_blocks=info.num_gpu_blocks, max_num_seqs=SMALL_BATCH,
                          max_model_len=limit)
    engine = EngineCore(**engine_parts(config, recording))
    rng = random.Random(seed)
    vocab = range(1000, info.vocab_size) if info.vocab_size > 2000 else range(3, info.vocab_size)
    running, target, added = 0, 1, 0
    try:
        for step in progress(range(iterations)):
            if step % 10 == 0:
                target = rng.randint(1, SMALL_BATCH)
            if running < target:         # one arrival an iteration at most, as in serving
                prompt = [rng.choice(vocab) for _ in range(rng.randint(4, min(96, limit // 2)))]
                params = SamplingParams(max_tokens=rng.randint(4, min(64, limit - len(prompt))),
                                        ignore_eos=True, temperature=0.0)
                engine.add_request(f"serve{added}", prompt_token_ids=prompt,
                                   sampling_params=params)
                running, added = running + 1, added + 1
            running -= sum(out.finished for out in engine.step())
    finally:
        engine.close()
    return recording.calls


def run_profile(executor: InProcessExecutor, *, max_tokens: int = 2048, repeats: int = 3,
                serving_iterations: int = 300,
                progress: Callable[[Iterable], Iterable] = iter) -> Profile:
    info = executor.model_info()
    kv_tokens = info.num_gpu_blocks * info.block_size
    large = executor.device.type == "cuda"
    profiler = Profiler(executor, repeats)
    points = [profiler.measure(g) for g in progress(grid(max_tokens, kv_tokens,
                                                         info.max_model_len, large))]
    served = serving_pass(executor, serving_iterations, progress=progress)
    meta = {**environment(executor), "grid_points": len(points), "serving_points": len(served)}
    points += served
    return Profile(shape_of(executor), executor.device.type, info.block_size,
                   info.num_gpu_blocks, tuple(points), knots=KNOTS,
                   meta=meta, swap=measure_swaps(executor, repeats))


def environment(executor: InProcessExecutor) -> dict:
    import transformers
    dev = executor.device
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else platform.processor()
    return {"device_name": name or platform.machine(), "cpu_threads": torch.get_num_threads(),
            "attention_backend": executor.backend.name,
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "versions": {"python": platform.python_version(), "torch": torch.__version__,
                         "transformers": transformers.__version__, "lenserve": _version()}}


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("lenserve")
    except PackageNotFoundError:
        return "unknown"
