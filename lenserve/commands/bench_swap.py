"""``lenserve bench-swap``: KV swap bandwidth through the KV manager, INT8 size and accuracy.

Bandwidth: every block of a device KV pool of ``--num-blocks`` blocks (a preset's shape) is
swapped out to the host pool as requests of ``--blocks-per-request`` blocks (all handles
started, then waited), then swapped back in to a shuffled set of device blocks. The baseline
is a plain ``torch`` copy of the same bytes, device -> host and back, in the same run: the
ratio says how much of what the machine can copy the manager gets. Each figure is the median
of ``--repeats`` after a warm-up (which first touches the host pages and is checked).

Accuracy: greedy decoding of a few prompts, swapped out and back after ``--swap-after`` tokens,
compared with an uninterrupted run, for the exact host pool and for INT8.
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from lenserve_contract.sampling_params import SamplingParams
from services.executor.kv_cache import BlockAllocator
from services.executor.types import ExecutorInput, ScheduledSequence
from services.kvmanager.config import GIB, KVManagerConfig
from services.kvmanager.core import InProcessKVManager
from services.kvmanager.host_pool import host_block_bytes
from services.kvmanager.host_store import BlockLayout
from services.kvmanager.int8 import element_scale, quantize

if TYPE_CHECKING:   # the model code imports transformers' models: only when this command runs
    from services.executor.runner import InProcessExecutor

GREEDY = SamplingParams(temperature=0.0)
PROMPTS = [
    "The quick brown fox jumps over the lazy dog near the river bank",
    "Serving large language models needs a lot of memory for the key value cache",
    "Write a short poem about the sea and the wind",
    "Explain why the sky is blue in simple words",
    "List three ideas for a weekend trip with children",
    "What is the capital of France and why is it famous",
]


def register(subparsers) -> None:
    p = subparsers.add_parser("bench-swap", help="KV swap bandwidth, INT8 size and accuracy")
    p.add_argument("--model", default="opt-125m", help="preset whose KV shape is used")
    p.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    p.add_argument("--num-blocks", type=_positive, default=1000)
    p.add_argument("--blocks-per-request", type=_positive, default=100)
    p.add_argument("--block-size", type=_positive, default=16)
    p.add_argument("--repeats", type=_positive, default=3)
    p.add_argument("--agreement-model", default="opt-tiny",
                   help="model for the greedy token agreement (empty: skip)")
    p.add_argument("--new-tokens", type=_positive, default=16)
    p.add_argument("--swap-after", type=_positive, default=4)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--threads", type=int, default=None, help="CPU intra-op threads")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--codec-layers", type=_positive, default=None,
                   help="layers the INT8 codec quantizes per pass (default: as many as a "
                        "bounded temporary holds; 1: one layer at a time)")
    p.add_argument("--json", type=Path, default=None, help="also write the results here")
    p.set_defaults(func=run)


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
    return value


def run(args: argparse.Namespace) -> int:
    if args.swap_after >= args.new_tokens:
        raise ValueError(f"--swap-after ({args.swap_after}) must be below --new-tokens "
                         f"({args.new_tokens})")
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    result = {"model": args.model, "dtype": args.dtype, "device": args.device,
              "num_blocks": args.num_blocks, "blocks_per_request": args.blocks_per_request,
              "codec_layers": args.codec_layers,
              "cpu_threads": torch.get_num_threads()}
    result.update(bench_bandwidth(args))
    if args.agreement_model:
        result["agreement"] = bench_agreement(args)
    print(format_report(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


# -- bandwidth ----------------------------------------------------------------------------

def bench_bandwidth(args: argparse.Namespace) -> dict:
    from services.executor.models.loader import load_model
    from services.executor.runner import InProcessExecutor
    loaded = load_model(args.model, dtype=args.dtype, device=args.device, seed=args.seed)
    executor = InProcessExecutor(loaded, block_size=args.block_size,
                                 num_gpu_blocks=args.num_blocks, device=args.device)
    executor.kv.cache.normal_()
    executor.kv.codec_layers = args.codec_layers
    info = executor.model_info()
    layout = BlockLayout.from_model_info(info)
    out = {"device_block_bytes": layout.device_block_bytes,
           "host_block_bytes_fp": host_block_bytes(layout, False),
           "host_block_bytes_int8": host_block_bytes(layout, True),
           "swapped_bytes": args.num_blocks * layout.device_block_bytes}
    out["raw"] = raw_copy_times(executor.kv.cache, args.repeats)
    for name, int8 in (("fp", False), ("int8", True)):
        out[name] = swap_times(executor, args, int8)
    bytes_each_way = out["swapped_bytes"]
    for key in ("raw", "fp", "int8"):
        t = out[key]
        t["out_gbps"] = bytes_each_way / t["out_s"] / 1e9
        t["in_gbps"] = bytes_each_way / t["in_s"] / 1e9
        t["out_in_gbps"] = 2 * bytes_each_way / (t["out_s"] + t["in_s"]) / 1e9
    for key in ("fp", "int8"):
        out[key]["ratio_to_raw"] = out[key]["out_in_gbps"] / out["raw"]["out_in_gbps"]
    return out


def raw_copy_times(cache: torch.Tensor, repeats: int) -> dict:
    """The same bytes device -> host and back with one ``copy_`` each (pinned on CUDA)."""
    host = torch.empty(cache.shape, dtype=cache.dtype, pin_memory=cache.is_cuda)
    outs, ins = [], []
    for i in range(repeats + 1):
        outs.append(_timed(lambda: host.copy_(cache), cache))
        ins.append(_timed(lambda: cache.copy_(host), cache))
    return {"out_s": statistics.median(outs[1:]), "in_s": statistics.median(ins[1:])}


def _timed(fn, tensor: torch.Tensor) -> float:
    start = time.perf_counter()
    fn()
    if tensor.is_cuda:
        torch.cuda.synchronize(tensor.device)
    return time.perf_counter() - start


def swap_times(executor: InProcessExecutor, args: argparse.Namespace, int8: bool) -> dict:
    info = executor.model_info()
    per_block = host_block_bytes(BlockLayout.from_model_info(info), int8)
    config = KVManagerConfig(args.num_blocks * per_block / GIB, int8=int8)
    manager = InProcessKVManager(config, executor, info)
    rng, check = random.Random(args.seed), RoundTripCheck(executor.kv.cache, int8)
    outs, ins = [], []
    try:
        for i in range(args.repeats + 1):
            t_out, t_in = one_round_trip(manager, args, rng, check if i == 0 else None)
            outs.append(t_out)
            ins.append(t_in)
        link = manager.stats().link_bytes_out // (args.repeats + 1)
    finally:
        manager.close()
    return {"out_s": statistics.median(outs[1:]), "in_s": statistics.median(ins[1:]),
            "link_bytes_each_way": link, **check.result}


def one_round_trip(manager: InProcessKVManager, args, rng: random.Random, check=None):
    n, k = args.num_blocks, args.blocks_per_request
    sources = [list(range(i, min(i + k, n))) for i in range(0, n, k)]
    shuffled = list(range(n))
    rng.shuffle(shuffled)
    targets = [shuffled[s[0]:s[-1] + 1] for s in sources]
    if check:
        check.before(sources[0])
    start = time.perf_counter()
    for h in [manager.swap_out(f"r{i}", ids) for i, ids in enumerate(sources)]:
        h.wait()
    middle = time.perf_counter()
    for h in [manager.swap_in(f"r{i}", ids) for i, ids in enumerate(targets)]:
        h.wait()
    end = time.perf_counter()
    if check:
        check.after(targets[0])
    return middle - start, end - middle


class RoundTripCheck:
    """Compares one request's blocks before and after the warm-up round trip: exact for the
    fp pool (a bench of a broken copy would be worthless), error in quantization steps for
    INT8."""

    def __init__(self, cache: torch.Tensor, int8: bool):
        self.cache, self.int8, self.result = cache, int8, {}

    num_tokens = None       # the round trip swaps whole blocks

    def before(self, ids: list[int]) -> None:
        self.original = self.cache[:, :, ids].to("cpu", copy=True)

    def after(self, ids: list[int]) -> None:
        arrived = self.cache[:, :, ids].to("cpu").float()
        err = (arrived - self.original.float()).abs()
        if not self.int8:
            if err.max() > 0:
                raise RuntimeError("the exact swap round trip changed the KV data")
            return
        step = element_scale(quantize(self.original, self.num_tokens))
        self.result = {"int8_max_abs_error": float(err.max()),
                       "int8_max_error_in_steps": float((err / step).max()),
                       "int8_data_absmax": float(self.original.float().abs().max())}


# -- greedy token agreement ---------------------------------------------------------------

def bench_agreement(args: argparse.Namespace) -> dict:
    from services.executor.runner import InProcessExecutor
    executor = InProcessExecutor(args.agreement_model, block_size=args.block_size,
                                 num_gpu_blocks=256, dtype=args.dtype, device=args.device,
                                 seed=args.seed)
    result = {"model": args.agreement_model, "prompts": len(PROMPTS),
              "new_tokens": args.new_tokens, "swap_after": args.swap_after}
    baselines = [generate(executor, _encode(executor, p), args) for p in PROMPTS]
    for name, int8 in (("fp", False), ("int8", True)):
        manager = InProcessKVManager(KVManagerConfig(0.05, int8=int8), executor,
                                     executor.model_info())
        swapped = [generate(executor, _encode(executor, p), args, manager) for p in PROMPTS]
        manager.close()
        result[name] = agreement(baselines, swapped, args.swap_after)
    return result


def _encode(executor: InProcessExecutor, text: str) -> list[int]:
    return executor.tokenizer(text)["input_ids"]


def generate(executor: InProcessExecutor, prompt: list[int], args, manager=None) -> list[int]:
    """Greedy tokens; with a manager the request is swapped out after ``swap_after`` tokens,
    its device blocks overwritten, and swapped back in to other blocks. Blocks start with
    garbage, as blocks freed by other requests do."""
    bs = args.block_size
    executor.kv.cache.normal_(0, 100)
    alloc = BlockAllocator(executor.kv.num_blocks)
    table = alloc.allocate(-(-len(prompt) // bs))
    tokens = [_step(executor, prompt, 0, table, 0)]
    while len(tokens) < args.new_tokens:
        context = len(prompt) + len(tokens) - 1
        if manager is not None and len(tokens) == args.swap_after:
            table = _swap_round_trip(executor, manager, alloc, table, context)
        if len(table) * bs <= context:
            table = table + alloc.allocate(1)
        tokens.append(_step(executor, [tokens[-1]], context, table, len(tokens)))
    return tokens


def _step(executor, token_ids: list[int], computed: int, table: list[int], produced: int) -> int:
    seq = ScheduledSequence("r", token_ids, computed, table, True, GREEDY, produced)
    return executor.execute(ExecutorInput(produced, [seq])).sampled["r"]


def _swap_round_trip(executor, manager, alloc: BlockAllocator, table: list[int],
                     num_tokens: int) -> list[int]:
    manager.swap_out("r", table, num_tokens).wait()
    new_table = alloc.allocate(len(table))
    executor.kv.cache[:, :, table] = float("nan")       # freed blocks, reused by someone else
    manager.swap_in("r", new_table).wait()
    return new_table


def agreement(baselines: list[list[int]], swapped: list[list[int]], swap_after: int) -> dict:
    """Per-token agreement after the swap point, and the share of whole outputs identical."""
    pairs = [(a, b) for base, sw in zip(baselines, swapped)
             for a, b in zip(base[swap_after:], sw[swap_after:])]
    return {"token_agreement": sum(a == b for a, b in pairs) / len(pairs),
            "sequence_agreement": sum(b == s for b, s in zip(baselines, swapped))
            / len(baselines)}


# -- report -------------------------------------------------------------------------------

def format_report(r: dict) -> str:
    gb = r["swapped_bytes"] / 1e9
    head = (f"bench-swap: {r['model']} {r['dtype']} on {r['device']}, {r['num_blocks']} blocks "
            f"({gb:.3f} GB each way) in requests of {r['blocks_per_request']}, "
            f"{r['cpu_threads']} CPU threads")
    return "\n".join([head, *_bandwidth_lines(r), *_int8_lines(r), *_agreement_lines(r)])


def _bandwidth_lines(r: dict) -> list[str]:
    lines = []
    for key, label in (("raw", "raw torch copy"), ("fp", "manager, exact"),
                       ("int8", "manager, INT8")):
        t = r[key]
        line = (f"  {label:<15} out {t['out_gbps']:6.2f} GB/s  in {t['in_gbps']:6.2f} GB/s  "
                f"out+in {t['out_in_gbps']:6.2f} GB/s")
        lines.append(line + (f"  = {t['ratio_to_raw']:.2f} x raw" if key != "raw" else ""))
    return lines


def _int8_lines(r: dict) -> list[str]:
    fp, q, dev = r["host_block_bytes_fp"], r["host_block_bytes_int8"], r["device_block_bytes"]
    i8 = r["int8"]
    link_fp, link_q = r["fp"]["link_bytes_each_way"], i8["link_bytes_each_way"]
    return [f"  host bytes/block: exact {fp}, INT8 {q} (codes + 16-bit scale and offset per "
            f"channel and group of blocks): {fp / q:.3f}x fewer ({dev / q:.3f}x vs the device "
            f"block)",
            f"  link bytes each way: exact {link_fp}, INT8 {link_q} (quantized before the copy "
            f"out): {link_fp / max(link_q, 1):.3f}x fewer",
            f"  INT8 max abs error {i8['int8_max_abs_error']:.3g} on N(0,1) blocks "
            f"(|x| <= {i8['int8_data_absmax']:.3g}): "
            f"{i8['int8_max_error_in_steps']:.3f} quantization steps"]


def _agreement_lines(r: dict) -> list[str]:
    a = r.get("agreement")
    if a is None:
        return []
    return [f"  greedy agreement after swap ({key}, {a['model']}, {a['prompts']} prompts, swap "
            f"after {a['swap_after']} of {a['new_tokens']} tokens): tokens "
            f"{a[key]['token_agreement']:.1%}, whole outputs {a[key]['sequence_agreement']:.1%}"
            for key in ("fp", "int8")]
