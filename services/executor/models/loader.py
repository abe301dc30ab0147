"""Model loading: a preset name or a local Hugging Face checkpoint directory -> lenserve's model.

Hugging Face is the source of configs, weights and tokenizers, never the runtime. Presets are
made by initialising the Hugging Face model with a fixed seed and loading its state dict, so
``build_hf_model`` and ``load_model`` agree by construction (the benchmark and tests rely on it).
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import torch
from safetensors.torch import load_file
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PretrainedConfig

from lenserve_contract.sampling_params import InvalidRequestError
from services.executor.models.arch import ARCHITECTURES, supported_message
from services.executor.models.llama import LlamaForCausalLM
from services.executor.models.naming import (  # noqa: F401 - re-exported
    ModelNotFoundError,
    preset_notice,
    preset_tokenizer,
    resolve,
)
from services.executor.models.opt import OPTForCausalLM
from services.executor.models.presets import PRESETS
from services.hardware import cpu_has_native_bf16

log = logging.getLogger(__name__)

# model_type -> the module that runs it: every Llama-like family is one decoder with switches.
FAMILIES: dict[str, type[nn.Module]] = {"opt": OPTForCausalLM,
                                        **{t: LlamaForCausalLM for t in ARCHITECTURES}}
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
# Files that carry a tokenizer's vocabulary (fast, SentencePiece, BPE, WordPiece): a checkpoint
# with none of them has no tokenizer, whatever its tokenizer_config.json says.
TOKENIZER_VOCAB_FILES = ("tokenizer.json", "tokenizer.model", "spiece.model",
                         "sentencepiece.bpe.model", "vocab.json", "vocab.txt")
# Presets whose random weights were already pointed out: once per process is enough (a
# benchmark builds one engine per policy).
_NOTED_PRESETS: set[str] = set()


class NoTokenizer:
    """The tokenizer of a model loaded without one (vLLM's ``skip_tokenizer_init``): prompts
    must come as token ids, and outputs carry token ids with empty text."""

    def __init__(self, why: str):
        self.why = why

    def encode(self, text: str, **kwargs) -> list[int]:
        raise InvalidRequestError(f"{self.why}: pass prompt_token_ids instead of a text prompt",
                                  field="prompt", code="no_tokenizer")

    __call__ = encode

    def decode(self, token_ids, **kwargs) -> str:
        return ""


@dataclass
class LoadedModel:
    model: nn.Module
    tokenizer: object
    hf_config: PretrainedConfig
    name: str
    family: str
    eos_token_id: int | None
    max_model_len: int
    dtype: torch.dtype
    eos_token_ids: tuple[int, ...] = ()     # every stop token; eos_token_id is the first


def resolve_dtype(name: str, device: str | torch.device = "cpu") -> str:
    """``auto``: bfloat16 on a GPU and on a CPU with native bf16 arithmetic, float32 on
    other CPUs, which would convert every bf16 operand to fp32. On a 2-core AMD
    EPYC (Zen 4, AVX512-BF16), opt-125m in bf16 ran 200 ShareGPT requests at once at 1.80-2.04x
    the fp32 output rate, and light load at 0.34-0.39x its time per output token
    (README, "Measured on a 2-core CPU")."""
    if name != "auto":
        return name
    native = torch.device(device).type == "cuda" or cpu_has_native_bf16()
    return "bfloat16" if native else "float32"


def torch_dtype(name: str, device: str | torch.device = "cpu") -> torch.dtype:
    name = resolve_dtype(name, device)
    if name not in DTYPES:
        raise InvalidRequestError(f"unknown dtype {name!r}: choose one of {sorted(DTYPES)}",
                                  field="dtype")
    return DTYPES[name]


def check_device(device: str) -> torch.device:
    """``device`` as a torch device, or InvalidRequestError saying why it cannot be used."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise InvalidRequestError(f"unknown device {device!r}: use 'cpu' or 'cuda[:N]'",
                                  field="device") from exc
    if dev.type != "cuda":
        return dev
    if not torch.cuda.is_available():
        why = (f"this torch ({torch.__version__}) is built without CUDA"
               if torch.version.cuda is None else "no CUDA GPU is visible")
        raise InvalidRequestError(f"device {device!r} is not available: {why}; use 'cpu'",
                                  field="device")
    if dev.index is not None and dev.index >= torch.cuda.device_count():
        raise InvalidRequestError(f"device {device!r} is not available: "
                                  f"{torch.cuda.device_count()} CUDA device(s) visible",
                                  field="device")
    return dev


def family_of(config: PretrainedConfig) -> str:
    family = getattr(config, "model_type", "")
    if family not in FAMILIES:
        archs = getattr(config, "architectures", None) or []
        named = f" ({', '.join(archs)})" if archs else ""
        raise InvalidRequestError(
            f"model family {family!r}{named} is not supported: lenserve runs "
            f"{supported_message()}", field="model", code="unsupported_model")
    return family


def _raw_config(path: Path) -> SimpleNamespace:
    raw = json.loads((path / "config.json").read_text())
    return SimpleNamespace(model_type=raw.get("model_type", ""),
                           architectures=raw.get("architectures"))


def build_hf_model(model: str, *, dtype: str = "float32", seed: int = 0,
                   device: str = "cpu") -> nn.Module:
    """The Hugging Face ``*ForCausalLM`` with the weights ``load_model`` gives."""
    name, path = resolve(model)
    if path is not None:
        return AutoModelForCausalLM.from_pretrained(
            path, dtype=torch_dtype(dtype, device)).to(device).eval()
    config = PRESETS[name].hf_config()
    # A private RNG stream: presets must not depend on, nor disturb, the caller's RNG state.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        hf = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    return hf.to(device=device, dtype=torch_dtype(dtype, device)).eval()


def _checkpoint_weights(path: Path) -> dict[str, torch.Tensor]:
    index = path / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    else:
        files = [f.name for f in sorted(path.glob("*.safetensors"))]
    if not files:
        raise InvalidRequestError(f"checkpoint {str(path)!r} has no *.safetensors weights",
                                  field="model", code="unknown_model")
    weights: dict[str, torch.Tensor] = {}
    for f in files:
        weights.update(load_file(str(path / f)))
    return weights


def _instantiate(config: PretrainedConfig, weights: dict[str, torch.Tensor],
                 dtype: torch.dtype, device: str) -> nn.Module:
    family = family_of(config)
    # Built on the meta device: no time spent on a random init that the weights overwrite.
    with torch.device("meta"):
        model = FAMILIES[family](config)
    model = model.to_empty(device=device).to(dtype)
    model.load_hf_weights(weights)
    return model.eval()


def checkpoint_tokenizer(path: Path, skip_tokenizer_init: bool = False):
    """The checkpoint's tokenizer; a NoTokenizer when asked to skip it or when it has none, so
    a checkpoint without tokenizer files still runs on prompt token ids."""
    if skip_tokenizer_init:
        return NoTokenizer(f"model {path.name!r} was loaded with skip_tokenizer_init")
    if not any((path / f).is_file() for f in TOKENIZER_VOCAB_FILES):
        # Info, not a warning: a text prompt is refused with this reason anyway.
        log.info("checkpoint %s has no tokenizer files (%s): prompts must be token ids and "
                    "outputs carry no text", path, ", ".join(TOKENIZER_VOCAB_FILES))
        return NoTokenizer(f"checkpoint {str(path)!r} has no tokenizer files")
    return AutoTokenizer.from_pretrained(path)


def _note_preset(name: str) -> None:
    """Say once that a preset's output means nothing: its name reads like the real model's.
    A warning, so that a command shows it on stderr as one ``lenserve:`` line."""
    if name not in _NOTED_PRESETS:
        _NOTED_PRESETS.add(name)
        log.warning("%s", preset_notice(name))


def load_model(model: str, *, dtype: str = "float32", device: str = "cpu", seed: int = 0,
               skip_tokenizer_init: bool = False) -> LoadedModel:
    """``skip_tokenizer_init``: load no tokenizer (as vLLM's option); prompts must then be
    token ids and outputs carry token ids only."""
    name, path = resolve(model)
    check_device(device)   # before any weights are read
    torch_dt = torch_dtype(dtype, device)
    if path is None:
        hf = build_hf_model(name, dtype="float32", seed=seed)
        config, weights = hf.config, hf.state_dict()
        tokenizer = (NoTokenizer(f"model {name!r} was loaded with skip_tokenizer_init")
                     if skip_tokenizer_init else preset_tokenizer())
    else:
        family_of(_raw_config(path))     # before transformers, which may not know the type
        config = AutoConfig.from_pretrained(path)
        weights = _checkpoint_weights(path)
        tokenizer = checkpoint_tokenizer(path, skip_tokenizer_init)
    net = _instantiate(config, weights, torch_dt, device)
    if path is None:
        _note_preset(name)
    eos = eos_token_ids(config, path)
    return LoadedModel(
        model=net, tokenizer=tokenizer, hf_config=config, name=name, family=config.model_type,
        eos_token_id=eos[0] if eos else None, eos_token_ids=eos,
        max_model_len=int(config.max_position_embeddings), dtype=torch_dt)


def eos_token_ids(config: PretrainedConfig, path: Path | None) -> tuple[int, ...]:
    """The config's EOS id(s), then those of generation_config.json (Llama 3 Instruct lists
    three, Qwen2.5 Instruct two): any of them ends a text, as in ``generate``."""
    ids: list[int] = []

    def add(value) -> None:
        for v in value if isinstance(value, list) else [value]:
            if isinstance(v, int) and v not in ids:
                ids.append(v)

    add(getattr(config, "eos_token_id", None))
    gen = path / "generation_config.json" if path is not None else None
    if gen is not None and gen.is_file():
        add(json.loads(gen.read_text()).get("eos_token_id"))
    return tuple(ids)
