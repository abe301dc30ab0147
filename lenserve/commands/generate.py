"""``lenserve generate``: one prompt in, its completion out."""
from __future__ import annotations

import argparse

from lenserve.commands.engine_args import add_engine_arguments, engine_options
from lenserve_contract.sampling_params import SamplingParams
from services.executor.attention.registry import BACKEND_CHOICES


def register(subparsers) -> None:
    p = subparsers.add_parser("generate", help="generate a completion for one prompt")
    p.add_argument("--model", required=True, help="model path or preset ('fake': no model)")
    p.add_argument("--prompt", required=True)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=-1)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--ignore-eos", action="store_true")
    p.add_argument("--policy", default="vllm")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--num-gpu-blocks", type=int, default=None)
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--attention-backend", default="auto", choices=BACKEND_CHOICES,
                   help="auto: triton on CUDA, the C++ kernel (cpu) on a CPU, else torch")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--device", default="cpu")
    add_engine_arguments(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from lenserve.entrypoints.llm import LLM

    params = SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                            seed=args.seed, max_tokens=args.max_tokens, stop=args.stop,
                            ignore_eos=args.ignore_eos)
    llm = LLM(args.model, policy=args.policy, block_size=args.block_size,
              max_model_len=args.max_model_len,
              attention_backend=args.attention_backend, dtype=args.dtype, device=args.device,
              seed=args.seed or 0, **engine_options(args))
    out = llm.generate(args.prompt, params)[0]
    print(out.outputs[0].text)
    return 0
