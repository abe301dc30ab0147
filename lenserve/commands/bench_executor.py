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
from pathlib import Path

import torch

from lenserve_contract.sampling_params import SamplingParams
from services.executor.attention.registry import BACKEND_CHOICES, resolve_backend
from services.executor.models.loader import LoadedModel, load_model
from services.executor.runner import InProcessExecutor
from services.executor.types import ExecutorInput, ScheduledSequence

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
    p.add_argument("--dtype", default="float32")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--threads", type=int, default=None,
                   help="CPU intra-op threads (default: torch's); 1 avoids thread thrash on a "
                        "machine whose cores are shared with other work")
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
    loaded = load_model(args.model, dtype=args.dtype, device=args.device)
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
    for batch in args.batch_sizes:
        rows.append(bench_batch(loaded, args, batch, weight_bytes, bandwidth))
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return {"model": loaded.name, "family": loaded.family, "dtype": args.dtype,
            "device": str(device), "cpu_threads": torch.get_num_threads(),
            "attention_backend": resolve_backend(args.attention_backend, str(device)),
            "prompt_len": args.prompt_len, "context_len": args.context_len,
            "weight_bytes": weight_bytes, "copy_bandwidth_bytes_per_s": bandwidth,
            "decode_floor_weights_s": weight_bytes / bandwidth, "rows": rows}


def bench_batch(loaded: LoadedModel, args, batch: int, weight_bytes: int, bandwidth: float) -> dict:
    bs = args.block_size
    per_seq = -(-max(args.prompt_len, args.context_len) // bs)
    executor = InProcessExecutor(loaded, block_size=bs, num_gpu_blocks=batch * per_seq,
                                 attention_backend=args.attention_backend)
    tables = [list(range(i * per_seq, (i + 1) * per_seq)) for i in range(batch)]
    gen = torch.Generator().manual_seed(batch)
    prefill = [ScheduledSequence(f"p{i}", _tokens(gen, args.prompt_len, loaded), 0, t, True,
                                 GREEDY) for i, t in enumerate(tables)]
    decode = [ScheduledSequence(f"d{i}", _tokens(gen, 1, loaded), args.context_len - 1, t, True,
                                GREEDY) for i, t in enumerate(tables)]
    prefill_s = time_iteration(executor, prefill, args.repeats)
    decode_s = time_iteration(executor, decode, args.repeats)
    kv_bytes = batch * args.context_len * executor.kv.block_bytes / bs
    floor_s = (weight_bytes + kv_bytes) / bandwidth
    return {"batch_size": batch, "prefill_s": prefill_s,
            "prefill_tokens_per_s": batch * args.prompt_len / prefill_s,
            "decode_s": decode_s, "decode_tokens_per_s": batch / decode_s,
            "decode_floor_s": floor_s, "decode_floor_tokens_per_s": batch / floor_s}


def _tokens(gen: torch.Generator, n: int, loaded: LoadedModel) -> list[int]:
    return torch.randint(1000, loaded.model.vocab_size, (n,), generator=gen).tolist()


def time_iteration(executor: InProcessExecutor, seqs: list[ScheduledSequence],
                   repeats: int) -> float:
    """Median wall time of ``execute`` after one warm-up; sampling's host copy syncs devices."""
    times = []
    for i in range(repeats + 1):
        start = time.perf_counter()
        executor.execute(ExecutorInput(i, seqs))
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
            f"{'decode ms':>10} {'floor ms':>9} {'floor tok/s':>12}")
    lines = [head, cols]
    for row in r["rows"]:
        lines.append(f"{row['batch_size']:>6} {row['prefill_tokens_per_s']:>14.1f} "
                     f"{row['prefill_s'] * 1e3:>11.1f} {row['decode_tokens_per_s']:>13.1f} "
                     f"{row['decode_s'] * 1e3:>10.1f} {row['decode_floor_s'] * 1e3:>9.2f} "
                     f"{row['decode_floor_tokens_per_s']:>12.1f}")
    return "\n".join(lines)
