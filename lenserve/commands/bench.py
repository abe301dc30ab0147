"""``lenserve bench``: replay one workload against several backends and print them side by side.

Flags follow ``vllm bench serve`` where they overlap; ``--backends`` and ``--sweep-rates`` are
lenserve's own. Without flags it sends 50 conversations of the bundled ShareGPT sample at once
to opt-125m with a 64-block KV pool and a 1 GiB host tier, and gives length-aware policies
(alise, ssjf, ...) the embedded predictor: a comparison of two policies that runs on a 2-core
CPU in about a minute.
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import time
from pathlib import Path

from lenserve.bench.backends import BackendOptions, BackendSpec, create_backend, parse_backends
from lenserve.bench.defaults import (
    BENCH_NUM_GPU_BLOCKS,
    BENCH_WORKLOAD,
    BLOCK_SIZE,
    BENCH_SWAP_SPACE_GIB,
    MODEL_CONTEXT,
    REQUESTS_PER_POOL,
    WorkloadDefaults,
    backend_predictor,
    kv_sizes,
)
from lenserve.bench.metrics import parse_goodput, parse_jct_slo
from lenserve.bench.report import (
    format_profiles,
    format_report,
    plot_normalized_latency,
    summarize_runs,
    write_json,
)
from lenserve.bench.runner import BackendRun, RunnerConfig, replay, warm_up
from lenserve.commands.engine_args import add_engine_arguments
from lenserve.workloads import (
    DATASET_NAMES,
    ArrivalConfig,
    Sample,
    SampleConfig,
    Workload,
    build_workload,
    load_samples,
    sample_requests,
)
from lenserve.workloads.arrivals import check_rate
from lenserve.workloads.datasets import load_conversations
from lenserve.workloads.multiturn import (
    MultiTurnConfig,
    multiturn_requests,
    shared_prefix,
    system_prompt_ids,
    timed,
)
from lenserve.workloads.token_cache import LazyTokenizer, TokenCache, default_cache_dir
from services.hardware import DTYPE_AUTO_HELP


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("bench", help="compare serving backends on one workload",
                              description=__doc__)
    p.add_argument("--backends", default="lenserve:vllm",
                   help="comma-separated: lenserve:<policy>, hf-static, hf-cb, openai:<url>")
    p.add_argument("--model", default="opt-125m",
                   help="lenserve model: a preset (random weights) or a Hugging Face checkpoint "
                        "directory; also the tokenizer")
    add_workload_arguments(p, BENCH_WORKLOAD)
    p.add_argument("--served-model-name", help="`model` field sent to openai:<url> backends")
    p.add_argument("--hf-batch-size", type=int, default=8, help="requests per hf-static batch")
    p.add_argument("--device", default="cpu",
                   help="where lenserve and the hf-* backends run: cpu, cuda[:N]")
    p.add_argument("--dtype", default="auto", help=DTYPE_AUTO_HELP)
    # Before the engine flags, which then keep this one (its default differs from theirs).
    p.add_argument("--num-gpu-blocks", type=int, default=None,
                   help=f"KV blocks of {BLOCK_SIZE} tokens of each lenserve:<policy> engine "
                        f"(default {BENCH_NUM_GPU_BLOCKS}, grown to hold {REQUESTS_PER_POOL} "
                        "requests of --max-model-len): size it against the workload to make "
                        "requests queue")
    add_engine_arguments(p)
    # Left out, --predictor is the embedded one for the policies that read predictions and
    # none for the others (``backend_predictor``). --swap-space: see BENCH_SWAP_SPACE_GIB.
    p.set_defaults(func=run_bench, predictor=None, swap_space=BENCH_SWAP_SPACE_GIB)


def add_workload_arguments(p: argparse.ArgumentParser,
                           defaults: WorkloadDefaults = WorkloadDefaults()) -> None:
    """The workload, arrival and report flags ``bench`` and ``simulate`` share."""
    p.add_argument("--tokenizer", help="Hugging Face tokenizer path, instead of the preset's")
    p.add_argument("--dataset-name", default=defaults.dataset_name, choices=DATASET_NAMES,
                   help=f"default {defaults.dataset_name}")
    p.add_argument("--dataset-path",
                   help="dataset file; without it sharegpt reads the bundled 400-conversation "
                        "sample and lengths the bundled Azure trace")
    p.add_argument("--num-prompts", type=int, default=defaults.num_prompts,
                   help=f"default {defaults.num_prompts}")
    p.add_argument("--repeat-dataset", action="store_true",
                   help="cycle through the dataset when --num-prompts exceeds what fits")
    p.add_argument("--request-rate", type=float, default=defaults.request_rate,
                   help=f"requests/s (inf sends all at once; default {defaults.request_rate:g})")
    p.add_argument("--burstiness", type=float, default=1.0, help="gamma shape; 1 is Poisson")
    p.add_argument("--trace-timestamps", action="store_true",
                   help="replay the trace's own arrival times instead of --request-rate")
    p.add_argument("--trace-time-scale", type=float, default=1.0,
                   help="multiply trace inter-arrival times (0.5 = twice as fast)")
    p.add_argument("--sweep-rates", help="comma-separated request rates; also draws a PNG")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--output-len", type=int, help="force every output to this many tokens")
    p.add_argument("--trace-block-tokens", type=int, default=512, metavar="N",
                   help="mooncake: tokens each of the trace's 512-token hash blocks becomes "
                        "(fewer scale every prompt down alike, keeping which prefixes are "
                        "shared; for models whose context is shorter than the trace's prompts)")
    p.add_argument("--system-prompt-len", type=int, default=0, metavar="TOKENS",
                   help="put the same TOKENS-token system prompt in front of every prompt "
                        "(prefix caching serves it after the first request); 0: none")
    p.add_argument("--think-time", type=float, default=5.0, metavar="S",
                   help="sharegpt-multiturn: mean pause (exponential) between a reply and "
                        "the conversation's next turn")
    p.add_argument("--max-prompt-len", type=int, default=1024)
    p.add_argument("--max-model-len", type=int, default=defaults.max_model_len,
                   help="prompt + output limit; longer requests are left out of the workload "
                        + (f"(default {defaults.max_model_len})" if defaults.max_model_len else
                           f"(default: 1/{REQUESTS_PER_POOL} of the KV pool, at most "
                           f"{MODEL_CONTEXT})"))
    p.add_argument("--goodput", nargs="+", metavar="KEY:MS", help="SLOs, e.g. ttft:500 tpot:50")
    p.add_argument("--jct-slo", metavar="SCALE[:TP_MS:TG_MS]",
                   help="report the SLO satisfaction ratio for EconoServe's JCT SLO, SCALE x "
                        "(tp + tg x output tokens); without TP_MS:TG_MS, tp and tg are the "
                        "mean TTFT and TPOT of the first backend at the lowest rate")
    p.add_argument("--result-json", help="write summaries and per-request records here")
    p.add_argument("--no-records", action="store_true",
                   help="leave the per-request records out of --result-json (summaries only: "
                        "a long simulated sweep's records run to hundreds of MB)")
    p.add_argument("--plot", help="PNG path for the sweep figure (default: next to the JSON)")
    p.add_argument("--disable-tqdm", action="store_true")
    p.add_argument("--no-token-cache", action="store_true",
                   help="count the dataset's tokens afresh instead of reusing the counts kept "
                        "in $LENSERVE_CACHE_DIR (default ~/.cache/lenserve; 'off' disables)")


def parse_rates(args: argparse.Namespace) -> list[float]:
    if not args.sweep_rates:
        return [check_rate(args.request_rate)]
    if args.trace_timestamps:
        raise ValueError("--sweep-rates and --trace-timestamps cannot be combined")
    try:
        rates = [float(item) for item in args.sweep_rates.split(",") if item.strip()]
    except ValueError:
        raise ValueError(f"--sweep-rates must be numbers, got {args.sweep_rates!r}") from None
    for rate in rates:
        if not (check_rate(rate) and math.isfinite(rate)):
            raise ValueError("--sweep-rates must be finite (the figure's x axis)")
    if not rates:
        raise ValueError("--sweep-rates names no rate")
    return rates


def load_tokenizer(args: argparse.Namespace):
    """The served model's tokenizer: output lengths are counted in it."""
    if args.tokenizer:
        from transformers import AutoTokenizer
        return AutoTokenizer.from_pretrained(args.tokenizer)
    from services.executor.factory import FAKE_MODEL, load_tokenizer as model_tokenizer
    if args.model == FAKE_MODEL:
        return model_tokenizer(args.model)
    # Loaded when first used (never, when the token cache has every text): it imports
    # transformers and torch. A model's tokenizer loads without the model's weights.
    from services.executor.models.naming import tokenizer_source
    return LazyTokenizer(lambda: model_tokenizer(args.model), tokenizer_source(args.model))


def sample_config(args: argparse.Namespace) -> SampleConfig:
    return SampleConfig(num_prompts=args.num_prompts, seed=args.seed,
                        max_prompt_len=args.max_prompt_len, max_total_len=args.max_model_len,
                        fixed_output_len=args.output_len, contiguous=args.trace_timestamps,
                        repeat=args.repeat_dataset, trace_block_tokens=args.trace_block_tokens)


def build_workloads(args: argparse.Namespace, samples: list[Sample], cfg: SampleConfig,
                    rates: list[float], tokenizer) -> list[Workload]:
    """The same sampled requests, timed once per request rate (multi-turn: conversations
    started at the rate), each behind the shared system prompt if one is asked for."""
    system = system_prompt_ids(tokenizer, args.system_prompt_len, args.seed)
    if args.dataset_name == "sharegpt-multiturn":
        groups = multiturn_requests(load_conversations(args.dataset_path), tokenizer, MultiTurnConfig(
            cfg.num_prompts, cfg.seed, cfg.max_prompt_len - len(system),
            cfg.max_total_len - len(system), args.think_time,
            fixed_output_len=cfg.fixed_output_len), system)
        return [timed(args.dataset_name, groups, rate, args.burstiness, args.seed)
                for rate in rates]
    directory = None if getattr(args, "no_token_cache", False) else default_cache_dir()
    if system:
        cfg = dataclasses.replace(cfg, max_prompt_len=cfg.max_prompt_len - len(system),
                                  max_total_len=cfg.max_total_len - len(system))
    chosen = sample_requests(samples, cfg, tokenizer,
                             cache=TokenCache.for_tokenizer(tokenizer, directory))
    if system:
        chosen = [(r, s) for r, s in zip(shared_prefix((r for r, _ in chosen), system),
                                        (s for _, s in chosen))]
    return [build_workload(args.dataset_name, chosen, ArrivalConfig(
        rate, args.burstiness, args.seed, args.trace_timestamps, args.trace_time_scale))
        for rate in rates]


def run_backend(spec: BackendSpec, options: BackendOptions, workloads: list[Workload],
                rates: list[float], runner: RunnerConfig) -> list[BackendRun]:
    began, backend, runs = time.monotonic(), None, []
    try:
        for w, rate in zip(workloads, rates):
            # Every rate replays the same prompts: a backend whose predictor has seen their
            # replies would predict them exactly, so such a backend starts afresh per run.
            if backend is None or backend.learns_from_requests:
                if backend is not None:
                    backend.close()
                backend = create_backend(spec, options)
                backend.start()
                warm_up(backend, w, runner)
                if not runs:
                    setup = ", ".join(f"{k} {v}" for k, v in backend.describe().items())
                    print(f"{spec.text}: ready in {time.monotonic() - began:.1f}s"
                          + (f" ({setup})" if setup else ""), file=sys.stderr)
            runs.append(replay(backend, w, runner, rate))
        return runs
    finally:
        if backend is not None:
            backend.close()


def run_bench(args: argparse.Namespace) -> int:
    # Everything a typo can break is checked before any model loads.
    specs = parse_backends(args.backends)
    slos, jct_slo = parse_goodput(args.goodput), parse_jct_slo(args.jct_slo)
    rates = parse_rates(args)
    apply_kv_sizes(args)
    options = BackendOptions(model=args.model, hf_batch_size=args.hf_batch_size,
                             served_model_name=args.served_model_name,
                             predictor_seed=args.predictor_seed,
                             policy_config=tuple(args.policy_config or ()),
                             num_gpu_blocks=args.num_gpu_blocks, max_num_seqs=args.max_num_seqs,
                             max_model_len=args.max_model_len,
                             swap_space_gib=args.swap_space, kv_int8=args.kv_int8,
                             enable_prefix_caching=args.enable_prefix_caching,
                             prefix_cache_host_blocks=args.prefix_cache_host_blocks,
                             device=args.device, dtype=args.dtype,
                             enforce_eager=args.enforce_eager)
    per_backend = [with_predictor(spec, options, args.predictor) for spec in specs]
    cfg = sample_config(args)
    samples = load_samples(args.dataset_name, args.dataset_path)
    workloads = build_workloads(args, samples, cfg, rates, load_tokenizer(args))
    runner = RunnerConfig(show_progress=not args.disable_tqdm)
    runs, failures = [], 0
    for spec, spec_options in zip(specs, per_backend):
        try:
            runs += run_backend(spec, spec_options, workloads, rates, runner)
        except Exception as exc:  # noqa: BLE001 - one broken backend must not lose the others' results
            failures += 1
            print(f"lenserve bench: backend {spec.text} failed: {type(exc).__name__}: {exc}",
                  file=sys.stderr)
    results = summarize_runs(runs, slos, jct_slo)
    if results:
        print(format_report(results))
        print(format_profiles(runs))
    write_outputs(args, results, runs)
    return 1 if failures else 0


def apply_kv_sizes(args: argparse.Namespace) -> None:
    """Fill in the KV pool and context limit left out (recorded in --result-json as used);
    a context the pool cannot hold is an error that names the flags to pass."""
    sizes = kv_sizes(args.max_model_len, args.num_gpu_blocks)
    if sizes.note:
        print(f"lenserve bench: {sizes.note}", file=sys.stderr)
    args.max_model_len, args.num_gpu_blocks = sizes.max_model_len, sizes.num_gpu_blocks


def with_predictor(spec: BackendSpec, options: BackendOptions,
                   predictor: str | None) -> BackendOptions:
    """``options`` with the backend's predictor; says on stderr when one was chosen for it."""
    chosen = backend_predictor(spec, predictor)
    if predictor is None and chosen != "none":
        print(f"lenserve bench: {spec.text} ranks by predicted output length: using "
              f"--predictor {chosen} (pass --predictor to choose another for every backend)",
              file=sys.stderr)
    return dataclasses.replace(options, predictor=chosen)


def write_outputs(args: argparse.Namespace, results: list[dict], runs: list[BackendRun]) -> None:
    if args.result_json:
        config = {k: v for k, v in vars(args).items() if k != "func"}
        write_json(args.result_json, config, results, runs,
                   records=not getattr(args, "no_records", False))
    if args.sweep_rates and results:
        plot = args.plot or (str(Path(args.result_json).with_suffix(".png")) if args.result_json
                             else "bench_normalized_latency.png")
        plot_normalized_latency(plot, results)
        print(f"figure: {plot}", file=sys.stderr)
