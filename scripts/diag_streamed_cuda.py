"""Tell an ordering fault of the CUDA streamed-waves path from rounding (GPU only, well under
a minute for llama-tiny).

    python3 scripts/diag_streamed_cuda.py [--dtypes bfloat16 float32] [--stream-blocks 0]

Runs the workload of ``tests/engine/test_streamed_waves_gpu.py`` (16 requests, greedy) per
dtype through:

* ``vllm``: the reference, a pool that holds everything (decode iterations graph-replayed);
* ``vllm-eager``: the same without CUDA graphs;
* ``fluid``: ``fluidinfer`` streaming as the test runs it;
* ``fluid-async`` and ``fluid-serial``: ``fluidinfer`` with a schedule that does not depend on
  measured seconds, staging uploads on the side stream (events) against the same uploads
  serialised on the compute stream (synchronous copies, no events).

For each pair it prints the requests whose tokens differ and, at each request's first
differing step (the history before it is the same), the largest logit difference and the
reference's margin between its own token and the other run's: a margin within rounding
(zero: an exact tie) is a near-tied greedy choice flipped by rounding. Verdict: fluid-async
differing from fluid-serial is an ordering fault (the same kernels on the same shapes);
fluid differing from vllm in bfloat16 only, at near ties, is rounding.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "engine")]

# The GPU test's workload and settings, not a copy of them.
from engine_helpers import TickClock  # noqa: E402
from test_streamed_waves import BLOCK, HOST_GIB, workload  # noqa: E402

from lenserve.engine.llm_engine import EngineConfig, LLMEngine  # noqa: E402
from lenserve_contract.sampling_params import SamplingParams  # noqa: E402
from services.executor.models.loader import load_model  # noqa: E402
from services.executor.runner import InProcessExecutor  # noqa: E402

MAX_LEN = 64
DETERMINISTIC = ["stream_link_bound=false", "token_budget=256"]


def build(loaded, policy: str, blocks: int, swap_gib: float = 0.0, config=(),
          graphs: bool = True, serial: bool = False) -> LLMEngine:
    ex = InProcessExecutor(loaded, block_size=BLOCK, num_gpu_blocks=blocks,
                           max_model_len=MAX_LEN, cuda_graphs=graphs)
    cfg = EngineConfig(model="llama-tiny", policy=policy, max_model_len=MAX_LEN,
                       block_size=BLOCK, swap_space_gib=swap_gib, policy_config=tuple(config))
    engine = LLMEngine(cfg, executor=ex, clock=TickClock())
    if serial:
        engine.executor._staging.cuda = False   # synchronous copies on the compute stream
    return engine


def run(engine: LLMEngine, reqs):
    """Tokens per request and the logits of every sampled step, by (request, step)."""
    ex, logits = engine.executor, {}
    forward = ex.forward_logits

    def record(batch):
        out = forward(batch)
        rows = out[0].float().cpu()     # a graph's logits are overwritten by the next replay
        for row, seq in enumerate(s for s in batch.sequences if s.sample):
            logits[(seq.request_id, seq.num_output_tokens)] = rows[row]
        return out
    ex.forward_logits = record
    for rid, prompt, n in reqs:
        engine.add_request(rid, prompt_token_ids=prompt, sampling_params=SamplingParams(
            max_tokens=n, ignore_eos=True, temperature=0))
    done = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = list(out.outputs[0].token_ids)
    return done, logits, ex.stream_bytes


def compare(name: str, a, b) -> bool:
    (ta, la, _), (tb, lb, _) = a, b
    differ = sorted(r for r in ta if ta[r] != tb[r])
    print(f"  {name}: {len(differ)}/{len(ta)} requests differ")
    for rid in differ:
        step = next(i for i, (x, y) in enumerate(zip(ta[rid], tb[rid])) if x != y)
        ra, rb = la.get((rid, step)), lb.get((rid, step))
        if ra is None or rb is None:
            print(f"    {rid} step {step}: logits not recorded")
            continue
        ulp = float(torch.finfo(torch.bfloat16).eps) * float(ra.abs().max())
        margin = float(ra[ta[rid][step]] - ra[tb[rid][step]])
        print(f"    {rid} step {step}: max |dlogit| {float((ra - rb).abs().max()):.3g}, "
              f"reference margin {margin:.3g} (bf16 ulp at the top {ulp:.3g})")
    before = [float((la[k] - lb[k]).abs().max()) for k in la
              if k in lb and ta[k[0]][:k[1]] == tb[k[0]][:k[1]]]
    if before:
        print(f"    max |dlogit| over steps with the same history: {max(before):.3g}")
    return not differ


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dtypes", nargs="+", default=["bfloat16", "float32"])
    p.add_argument("--stream-blocks", type=int, default=0)
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("needs a CUDA device")
        return 2
    torch.backends.cuda.matmul.allow_tf32 = False
    reqs, verdicts = workload(0, 16), []
    sb = f"stream_kv_blocks={args.stream_blocks}"
    for dtype in args.dtypes:
        loaded = load_model("llama-tiny", dtype=dtype, device="cuda")
        runs = {
            "vllm": run(build(loaded, "vllm", 256), reqs),
            "vllm-eager": run(build(loaded, "vllm", 256, graphs=False), reqs),
            "fluid": run(build(loaded, "fluidinfer", 16, HOST_GIB, [sb]), reqs),
            "fluid-async": run(build(loaded, "fluidinfer", 16, HOST_GIB,
                                     [sb, *DETERMINISTIC]), reqs),
            "fluid-serial": run(build(loaded, "fluidinfer", 16, HOST_GIB, [sb, *DETERMINISTIC],
                                      serial=True), reqs),
        }
        print(f"{dtype}: bytes streamed " + ", ".join(
            f"{k} {v[2]}" for k, v in runs.items() if k.startswith("fluid")))
        same_order = compare("fluid-async vs fluid-serial", runs["fluid-async"],
                             runs["fluid-serial"])
        compare("vllm vs vllm-eager", runs["vllm"], runs["vllm-eager"])
        vs_vllm = compare("fluid vs vllm", runs["vllm"], runs["fluid"])
        compare("fluid-serial vs vllm", runs["vllm"], runs["fluid-serial"])
        verdicts.append((dtype, same_order, vs_vllm))
    for dtype, same_order, vs_vllm in verdicts:
        what = ("ORDERING FAULT: side-stream uploads change tokens" if not same_order else
                "tokens match vllm" if vs_vllm else
                "side stream matches serialised copies; the difference from vllm is the "
                "batching's rounding (see the margins)")
        print(f"{dtype}: {what}")
    return 0 if all(s for _, s, _ in verdicts) else 1


if __name__ == "__main__":
    sys.exit(main())
