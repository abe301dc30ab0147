"""``lenserve generate``: one prompt in, its completion out.

The completion goes to stdout; anything the user should know about it goes to stderr: a failed
run as one line (exit status 1), and a note when the context limit, not ``--max-tokens``,
ended the output.
"""
from __future__ import annotations

import argparse
import sys

from lenserve.commands.engine_args import add_engine_arguments, engine_options
from lenserve_contract.outputs import RequestOutput
from lenserve_contract.sampling_params import SamplingParams
from services.executor.attention.registry import BACKEND_CHOICES
from services.executor.models.presets import list_presets
from services.hardware import DTYPE_AUTO_HELP


def register(subparsers) -> None:
    p = subparsers.add_parser("generate", help="generate a completion for one prompt")
    p.add_argument("--model", required=True,
                   help="a Hugging Face checkpoint directory (config.json, *.safetensors and "
                        "the tokenizer's files), a hub id (org/name: its snapshot in the "
                        "Hugging Face cache, fetched first unless HF_HUB_OFFLINE is set), or a "
                        "preset with random weights "
                        f"({', '.join(list_presets())}; 'fake': no model)")
    prompt = p.add_mutually_exclusive_group(required=True)
    prompt.add_argument("--prompt")
    prompt.add_argument("--prompt-token-ids", type=int, nargs="+", metavar="ID",
                        help="the prompt as token ids (for a checkpoint without a tokenizer)")
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
    p.add_argument("--dtype", default="auto",
                   help=DTYPE_AUTO_HELP)
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
    if args.prompt_token_ids is not None:
        out = llm.generate(prompt_token_ids=args.prompt_token_ids, sampling_params=params)[0]
    else:
        out = llm.generate(args.prompt, params)[0]
    if out.error is not None or out.outputs[0].finish_reason == "error":
        return report_failure(out, getattr(args, "debug", False))
    print(output_text(out.outputs[0], llm.get_tokenizer()))
    note = context_limit_note(out, params, llm, args.max_model_len)
    if note:
        print(f"lenserve generate: note: {note}", file=sys.stderr)
    return 0


def report_failure(out: RequestOutput, debug: bool) -> int:
    # The engine finishes a request whose iteration failed with the error and logs the
    # traceback, which the command's logging shows with --debug only.
    hint = "" if debug else " (--debug shows the traceback)"
    print(f"lenserve generate: error: {out.error or 'the request failed'}{hint}", file=sys.stderr)
    return 1


def output_text(completion, tokenizer) -> str:
    """The completion's text, or its token ids when the model has no tokenizer to decode them."""
    from services.executor.models.loader import NoTokenizer

    if isinstance(tokenizer, NoTokenizer):
        return " ".join(map(str, completion.token_ids))
    return completion.text


def context_limit_note(out: RequestOutput, params: SamplingParams, llm,
                       max_model_len: int | None) -> str | None:
    """Why the output is shorter than ``max_tokens`` when the context limit cut it, else None.

    The context is ``--max-model-len`` when given, else the least of the model's positions and
    the KV pool (``--num-gpu-blocks`` x ``--block-size`` tokens); a small pool would otherwise
    cut the output without a word."""
    completion = out.outputs[0]
    got = len(completion.token_ids)
    if completion.finish_reason != "length" or got >= params.max_tokens:
        return None
    limit = llm.engine.scheduler.config.max_model_len
    info = llm.engine.model_info
    kv_tokens = info.num_gpu_blocks * info.block_size
    if max_model_len is not None:
        cause = f"--max-model-len is {limit}; raise it"
    elif limit == kv_tokens and limit < info.max_model_len:
        cause = (f"the KV cache holds {info.num_gpu_blocks} block(s) of {info.block_size} "
                 f"tokens = {kv_tokens} tokens; raise --num-gpu-blocks (or --block-size)")
    else:
        cause = f"that is the model's maximum context ({info.max_model_len} positions)"
    return (f"output stopped at {got} of --max-tokens {params.max_tokens} tokens: the prompt "
            f"({len(out.prompt_token_ids)} tokens) and the output reached the context limit "
            f"of {limit} tokens; {cause}")
