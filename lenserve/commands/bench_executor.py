"""``lenserve bench-executor``: tokens/s of single executor iterations, prefill and decode.

Prefill: one iteration of B whole prompts of ``--prompt-len`` tokens. Decode: one iteration of B
single tokens, each at ``--context-len`` (the KV content is whatever the pool holds: attention
cost depends on lengths, not values). Each point is a warm-up plus the median of repeats.
The decode floor is the time to stream the weights (and the batch's KV) once at the measured
device copy bandwidth: no decode iteration can be faster on a memory-bound device.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from lenserve_contract.sampling_params import SamplingParams
from services.executor.attention.registry import BACKEND_CHOICES, resolve_backend
from services.executor.types import ExecutorInput, ScheduledSequence
from services.hardware import DTYPE_AUTO_HELP

if TYPE_CHECKING:   # the model code imports transformers' models: only when this command runs
    from services.executor.models.loader import LoadedModel
    from services.executor.runner import InProcessExecutor

GREEDY = SamplingParams(temperature=0.0)


def register(subparsers) -> None:
    p = subparsers.add_parser("bench-executor", help="prefill/decode tokens/s of one iteration")
    p.add_argument("--model", required=True, help="preset name or local checkpoint directory")
    p.add_argument("--attention-backend", default="auto", choices=BACKEND_CHOICES,
                   help="auto: triton on CUDA, the C++ kernel (cpu) on a CPU, else torch")
    p.add_argument("--batch-sizes", default="1,8,32,128", type=_int_list)
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--context-len", type=int, default=512)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--dtype", default="auto",
                   help=DTYPE_AUTO_HELP)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--threads", type=int, default=None,
                   help="CPU intra-op threads (default: torch's); 1 avoids thread thrash on a "
                        "machine whose cores are shared with other work")
    p.add_argument("--enforce-eager", action="store_true",
                   help="run decode eagerly (no CUDA graphs)")
    p.add_argument("--compare-eager", action="store_true",
                   help="also time eager decode in the same run (CUDA: graphs vs no graphs)")
    p.add_argument("--hf-peer", action="store_true",
                   help="also time transformers' generate with a static cache (eager) on the "
                        "same device: its decode step from prompt + --hf-new-tokens")
    p.add_argument("--hf-new-tokens", type=int, default=64)
    p.add_argument("--json", type=Path, default=None, help="also write the results here")
    p.set_defaults(func=run)


def _int_list(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"batch sizes must be >= 1, got {text!r}")
    return values


def run(args: argparse.Namespace) -> int:
    if args.threads:
        torch.set_num_threads(args.threads)
    from services.executor.models.loader import load_model
    loaded = load_model(args.model, dtype=args.dtype, device=args.device)
    args.dtype = str(loaded.dtype).removeprefix("torch.")
    if max(args.prompt_len, args.context_len) > loaded.max_model_len:
        raise ValueError(f"prompt/context length exceeds the model's {loaded.max_model_len}")
    result = benchmark(loaded, args)
    print(format_table(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


def benchmark(loaded: LoadedModel, args: argparse.Namespace) -> dict:
    device = torch.device(args.device)
    weight_bytes = sum(p.numel() * p.element_size() for p in loaded.model.parameters())
    bandwidth = copy_bandwidth(device)
    rows = []
    hf = None
    if args.hf_peer:
        from services.executor.models.loader import build_hf_model
        hf = build_hf_model(args.model, dtype=args.dtype, device=args.device)
    for batch in args.batch_sizes:
        row = bench_batch(loaded, args, batch, weight_bytes, bandwidth)
        if hf is not None:
            row["hf_static_decode_s"] = hf_static_decode_s(hf, args, batch)
        rows.append(row)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return {"model": loaded.name, "family": loaded.family, "dtype": args.dtype,
            "device": str(device), "cpu_threads": torch.get_num_threads(),
            "attention_backend": resolve_backend(args.attention_backend, str(device)),
            "prompt_len": args.prompt_len, "context_len": args.context_len,
            "weight_bytes": weight_bytes, "copy_bandwidth_bytes_per_s": bandwidth,
            "decode_floor_weights_s": weight_bytes / bandwidth, "rows": rows}


def bench_batch(loaded: LoadedModel, args, batch: int, weight_bytes: int, bandwidth: float) -> dict:
    from services.executor.runner import InProcessExecutor
    bs = args.block_size
    per_seq = -(-max(args.prompt_len, args.context_len) // bs)
    executor = InProcessExecutor(loaded, block_size=bs, num_gpu_blocks=batch * per_seq,
                                 attention_backend=args.attention_backend,
                                 cuda_graphs=not args.enforce_eager, max_graph_batch=batch)
    tables = [list(range(i * per_seq, (i + 1) * per_seq)) for i in range(batch)]
    gen = torch.Generator().manual_seed(batch)
    prefill = [ScheduledSequence(f"p{i}", _tokens(gen, args.prompt_len, loaded), 0, t, True,
                                 GREEDY) for i, t in enumerate(tables)]
    decode = [ScheduledSequence(f"d{i}", _tokens(gen, 1, loaded), args.context_len - 1, t, True,
                                GREEDY) for i, t in enumerate(tables)]
    # After its first iteration a request's table travels as a delta (empty here), as the
    # scheduler sends it.
    steady = [replace(s, block_table=[], block_table_is_delta=True) for s in decode]
    prefill_s = time_iteration(executor, prefill, args.repeats)
    decode_s = time_iteration(executor, decode, args.repeats, steady)
    kv_bytes = batch * args.context_len * executor.kv.block_bytes / bs
    floor_s = (weight_bytes + kv_bytes) / bandwidth
    row = {"batch_size": batch, "prefill_s": prefill_s,
           "prefill_tokens_per_s": batch * args.prompt_len / prefill_s,
           "decode_s": decode_s, "decode_tokens_per_s": batch / decode_s,
           "decode_floor_s": floor_s, "decode_floor_tokens_per_s": batch / floor_s,
           "cuda_graphs": executor.graphs is not None}
    if executor.graphs is not None and executor.graphs.last_key is not None:
        row["decode_graph_gpu_s"] = graph_replay_s(executor.graphs)
    if args.compare_eager and executor.graphs is not None:
        del executor
        eager = InProcessExecutor(loaded, block_size=bs, num_gpu_blocks=batch * per_seq,
                                  attention_backend=args.attention_backend, cuda_graphs=False)
        eager.execute(ExecutorInput(0, prefill))
        row["decode_eager_s"] = time_iteration(eager, decode, args.repeats, steady)
    return row


def graph_replay_s(graphs, repeats: int = 50) -> float:
    """GPU time of the last decode graph alone (events around back-to-back replays): the step
    without the host's share (staging, validation, sampling's copy)."""
    graph = graphs.graphs[graphs.last_key]
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(repeats):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / repeats


def hf_static_decode_s(hf, args, batch: int) -> float:
    """transformers' decode step: ``generate`` with a static cache, no compile, greedy; the
    time of ``n`` new tokens minus the time of one, over ``n - 1``."""
    gen = torch.Generator().manual_seed(batch)
    ids = torch.randint(1000, hf.config.vocab_size, (batch, args.prompt_len),
                        generator=gen).to(hf.device)

    def run(n: int) -> float:
        _sync(hf.device)
        start = time.perf_counter()
        with torch.inference_mode():
            hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n,
                        min_new_tokens=n, do_sample=False, cache_implementation="static",
                        disable_compile=True, pad_token_id=0)
        _sync(hf.device)
        return time.perf_counter() - start

    n = args.hf_new_tokens
    run(2)
    one = statistics.median(run(1) for _ in range(max(args.repeats // 3, 1)))
    many = statistics.median(run(n) for _ in range(max(args.repeats // 3, 1)))
    return (many - one) / (n - 1)


def _tokens(gen: torch.Generator, n: int, loaded: LoadedModel) -> list[int]:
    return torch.randint(1000, loaded.model.vocab_size, (n,), generator=gen).tolist()


def time_iteration(executor: InProcessExecutor, seqs: list[ScheduledSequence],
                   repeats: int, steady: list[ScheduledSequence] | None = None) -> float:
    """Median wall time of ``execute`` after one warm-up with ``seqs``, timing ``steady``
    (default ``seqs``); sampling's host copy syncs devices."""
    times = []
    for i in range(repeats + 1):
        start = time.perf_counter()
        executor.execute(ExecutorInput(i, seqs if i == 0 or steady is None else steady))
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:])


def copy_bandwidth(device: torch.device, nbytes: int = 256 << 20, repeats: int = 5) -> float:
    """Bytes moved per second (read + write) by a large device-to-device copy."""
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).fill_(1.0)
    dst = torch.empty_like(src)
    times = []
    for _ in range(repeats + 1):
        _sync(device)
        start = time.perf_counter()
        dst.copy_(src)
        _sync(device)
        times.append(time.perf_counter() - start)
    return 2 * nbytes / statistics.median(times[1:])


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def format_table(r: dict) -> str:
    head = (f"model {r['model']} ({r['family']}, {r['dtype']}, {r['device']}, attention "
            f"{r['attention_backend']}, {r['cpu_threads']} CPU threads): weights "
            f"{r['weight_bytes'] / 1e6:.1f} MB, copy bandwidth "
            f"{r['copy_bandwidth_bytes_per_s'] / 1e9:.1f} GB/s, decode floor (weights only) "
            f"{r['decode_floor_weights_s'] * 1e3:.2f} ms/iteration\n"
            f"prefill: prompt {r['prompt_len']} tokens; decode: context {r['context_len']} tokens")
    cols = (f"{'batch':>6} {'prefill tok/s':>14} {'prefill ms':>11} {'decode tok/s':>13} "
            f"{'decode ms':>10} {'floor ms':>9} {'floor tok/s':>12} {'x floor':>8} "
            f"{'gpu ms':>7} {'eager ms':>9} {'hf-static ms':>13}")
    lines = [head, cols]
    for row in r["rows"]:
        eager, hf = row.get("decode_eager_s"), row.get("hf_static_decode_s")
        gpu = row.get("decode_graph_gpu_s")
        lines.append(f"{row['batch_size']:>6} {row['prefill_tokens_per_s']:>14.1f} "
                     f"{row['prefill_s'] * 1e3:>11.1f} {row['decode_tokens_per_s']:>13.1f} "
                     f"{row['decode_s'] * 1e3:>10.2f} {row['decode_floor_s'] * 1e3:>9.2f} "
                     f"{row['decode_floor_tokens_per_s']:>12.1f} "
                     f"{row['decode_s'] / row['decode_floor_s']:>8.1f} "
                     f"{_ms(gpu):>7} {_ms(eager):>9} {_ms(hf):>13}")
    return "\n".join(lines)


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.2f}"
