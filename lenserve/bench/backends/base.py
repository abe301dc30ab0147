"""The one interface every backend under test implements, and the options they share."""
from __future__ import annotations

import itertools
from abc import ABC, abstractmethod
from dataclasses import dataclass

from lenserve.bench.metrics import RequestRecord
from lenserve.workloads.types import BenchRequest
from lenserve_contract.sampling_params import SamplingParams


@dataclass(frozen=True)
class BackendOptions:
    model: str = "opt-tiny"
    # Requests per `generate` call of hf-static (request-level batching, as in the papers' Orca
    # and FasterTransformer baselines).
    hf_batch_size: int = 8
    # KV capacity and per-step token budget of hf-cb; its automatic sizing targets GPU memory
    # and would reserve most of the host's RAM on CPU.
    hf_cb_kv_tokens: int = 16384
    hf_cb_max_batch_tokens: int = 2048
    served_model_name: str | None = None  # the `model` field sent to OpenAI endpoints
    request_timeout_s: float = 600.0
    # lenserve:<policy> engines. The KV pool is sized against the workload (num_gpu_blocks),
    # as the papers do: length-aware scheduling only pays where requests queue for KV.
    predictor: str = "none"
    predictor_seed: str | None = None
    policy_config: tuple[str, ...] = ()
    num_gpu_blocks: int | None = None
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    max_model_len: int | None = None
    swap_space_gib: float = 0.0
    kv_int8: bool = False
    enable_prefix_caching: bool = True
    prefix_cache_host_blocks: int = 0
    # Where lenserve and the hf-* backends run, in which dtype ("auto": bfloat16 on a GPU or
    # on a CPU with native bf16).
    device: str = "cpu"
    dtype: str = "auto"
    enforce_eager: bool = False

    def __post_init__(self) -> None:
        for name in ("hf_batch_size", "hf_cb_kv_tokens", "hf_cb_max_batch_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")


class Backend(ABC):
    """A serving system driven by the runner's real-time replay loop.

    The runner calls ``submit`` once a request's arrival time has passed, and ``poll`` in a
    loop; ``poll`` either advances the backend (one engine step, one HF batch) or waits up to
    ``timeout`` seconds for results, and returns the requests that finished. All times in the
    returned records are ``time.monotonic()`` seconds; ``arrival_time`` is the scheduled
    arrival, so time a request spends waiting for a busy synchronous backend counts as latency.
    """

    def __init__(self, name: str, options: BackendOptions):
        self.name = name
        self.options = options
        self._keys = itertools.count()

    def start(self) -> None:
        """Load the model or connect; called once before any run."""

    @abstractmethod
    def submit(self, request: BenchRequest, arrival_time: float) -> None: ...

    @abstractmethod
    def poll(self, timeout: float) -> list[RequestRecord]: ...

    @abstractmethod
    def has_pending(self) -> bool: ...

    def close(self) -> None:
        """Release the model or connection."""

    @property
    def learns_from_requests(self) -> bool:
        """True when serving a request changes how the backend treats later ones beyond its
        caches (a length predictor learning from completions): the runs of a sweep replay the
        same prompts, so such a backend is restarted for each run and warmed up on prompts the
        workload does not hold, lest a run be predicted from the replies of the one before."""
        return False

    def profile(self):
        """A cumulative ``StepProfile`` of where the backend's time went, if it keeps one."""
        return

    def clear_cache(self) -> None:
        """Forget KV kept from earlier requests (a prefix cache): the runs of a sweep and the
        warm-up replay the same prompts, and a run's hits must come from its own requests."""

    def counters(self) -> dict | None:
        """Cumulative counters the report shows per run (prefix cache queries and hits, in
        prompt tokens), if the backend keeps any."""
        return None

    def describe(self) -> dict:
        """What the started backend resolved its defaults to (``dtype`` "auto" depends on the
        machine), for the report and the result JSON; {} if it has nothing to add."""
        return {}

    def unique_key(self, request: BenchRequest) -> str:
        # Request ids repeat across the runs of a sweep and the warm-up; backends that keep
        # state by id get a fresh key per submission.
        return f"{request.request_id}#{next(self._keys)}"


def failed_record(request: BenchRequest, arrival_time: float, error: str) -> RequestRecord:
    return RequestRecord(request.request_id, request.prompt_len, request.output_len,
                         arrival_time, error=error)


def trace_params(context: int, **extra) -> SamplingParams:
    """What an in-process engine replaying a trace is sent: no max_tokens of its own (the
    context the prompt leaves, as a chat client that sets none gets) and the trace's reply
    length passed to ``add_request`` as ``true_output_len``, where the request ends as the
    model's end-of-sequence token would end it. ``vllm bench serve`` sends ``max_tokens`` =
    the trace's length instead; a length-aware policy caps its predictions at max_tokens, so
    that would hand it the true length of every reply it over-predicts."""
    return SamplingParams(max_tokens=context, ignore_eos=True, temperature=0.0,
                          cap_max_tokens=True, **extra)
