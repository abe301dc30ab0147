"""Factories for scheduler tests: hand-built requests, a scheduler, and a synthetic executor."""
from __future__ import annotations

from lenserve_contract.sampling_params import SamplingParams
from services.executor.types import ExecutorOutput
from services.scheduler.config import SchedulerConfig
from services.scheduler.request import Request
from services.scheduler.scheduler import Scheduler

TOKEN = 7


def make_request(rid: str, prompt_len: int, max_tokens: int = 8, **kw) -> Request:
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    return Request(rid, [1] * prompt_len, params, arrival_time=0.0, eos_token_id=2, **kw)


def make_scheduler(policy: str = "vllm", num_host_blocks: int = 0, copies_overlap: bool = True,
                   **overrides) -> Scheduler:
    fields = {"num_gpu_blocks": 64, "block_size": 4, "max_model_len": 128,
              "max_num_batched_tokens": 64, "max_num_seqs": 16, "policy": policy}
    fields.update(overrides)
    return Scheduler(SchedulerConfig(**fields), num_host_blocks=num_host_blocks,
                     copies_overlap=copies_overlap)


def add(scheduler: Scheduler, *requests: Request) -> list[Request]:
    for r in requests:
        scheduler.add_request(r)
    return list(requests)


def step(scheduler: Scheduler, now: float = 0.0):
    """One iteration with a synthetic executor that samples TOKEN wherever asked."""
    out = scheduler.schedule(now)
    batch = scheduler.make_executor_input(out)
    sampled = {s.request_id: TOKEN for s in batch.sequences if s.sample}
    scheduler.update_from_output(out, ExecutorOutput(out.iteration, sampled), now)
    scheduler.release_swapped_blocks()      # the synthetic executor's swap copies are instant
    scheduler.check_integrity()
    return out, batch


def scheduled(out) -> dict[str, int]:
    return {r.request_id: n for r, n in out.scheduled}
