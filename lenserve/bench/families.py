"""Token identity with Hugging Face ``generate``, per model family and attention backend.

Each family preset (``qwen3-tiny``, ``gemma2-tiny``, ...) is initialised by Hugging Face with a
fixed seed and saved as a checkpoint directory; Hugging Face's greedy ``generate`` on it is the
reference. lenserve's engine then loads the directory as any checkpoint and serves the same
prompts greedily through the paged KV cache, with a small token budget (so long prompts are
prefilled in chunks beside other requests' decodes) and small blocks (so sliding windows span
several). A row is identical when every prompt's tokens are.
"""
from __future__ import annotations

import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

# Lengths around the presets' windows (24, 40) and RoPE scalings' original length (64).
PROMPT_LENS = (5, 31, 47, 70)
QUICK_PROMPT_LENS = (5, 31)


@dataclass
class FamilyCheck:
    preset: str
    model_type: str
    backend: str
    device: str
    prompts: int
    identical: int
    first_divergence: str | None    # "prompt of N tokens, step S: ours X, HF Y"
    seconds: float

    @property
    def ok(self) -> bool:
        return self.identical == self.prompts

    def to_dict(self) -> dict:
        return {**asdict(self), "ok": self.ok}


def make_prompts(lens=PROMPT_LENS, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    # Skip the low ids: the special tokens of the WordPiece vocabulary live there.
    return [[rng.randrange(1000, 30000) for _ in range(n)] for n in lens]


def write_preset_checkpoint(preset: str, root: Path, seed: int = 0) -> Path:
    """The preset's Hugging Face model, saved as safetensors with its tokenizer."""
    from services.executor.models.loader import build_hf_model, preset_tokenizer

    path = Path(root) / preset
    build_hf_model(preset, seed=seed).save_pretrained(path)
    preset_tokenizer().save_pretrained(path)
    return path


def hf_greedy(path: Path, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    """Hugging Face's greedy tokens, EOS not stopping (``ignore_eos`` on our side)."""
    from services.executor.models.loader import build_hf_model

    hf = build_hf_model(str(path))
    hf.generation_config.eos_token_id = None    # no stop token: every output is max_tokens long
    out = []
    with torch.no_grad():
        for prompt in prompts:
            ids = torch.tensor([prompt])
            gen = hf.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                              max_new_tokens=max_tokens, pad_token_id=0)
            out.append(gen[0, len(prompt):].tolist())
    return out


def lenserve_greedy(path: Path, prompts: list[list[int]], max_tokens: int, backend: str,
                    device: str = "cpu") -> list[list[int]]:
    from lenserve.entrypoints.llm import LLM
    from lenserve_contract.sampling_params import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    with LLM(str(path), attention_backend=backend, device=device, dtype="float32",
             block_size=8, num_gpu_blocks=128, max_num_batched_tokens=32) as llm:
        outs = llm.generate(prompt_token_ids=prompts, sampling_params=params)
    return [list(o.outputs[0].token_ids) for o in outs]


def compare(preset: str, model_type: str, backend: str, device: str, prompts, want, got,
            seconds: float) -> FamilyCheck:
    first = None
    identical = 0
    for prompt, w, g in zip(prompts, want, got):
        if w == g:
            identical += 1
        elif first is None:
            step = next((i for i, (a, b) in enumerate(zip(g, w)) if a != b), min(len(g), len(w)))
            ours = g[step] if step < len(g) else None
            theirs = w[step] if step < len(w) else None
            first = f"prompt of {len(prompt)} tokens, step {step}: ours {ours}, HF {theirs}"
    return FamilyCheck(preset, model_type, backend, device, len(prompts), identical, first,
                       round(seconds, 2))


def check_families(presets: list[str], backends: list[str], root: Path, *,
                   lens=PROMPT_LENS, max_tokens: int = 6, device: str = "cpu",
                   log=print) -> list[FamilyCheck]:
    """Every preset against every backend; a backend that fails to run is a failed row with
    the error, not an aborted table."""
    from services.executor.models.presets import PRESETS

    prompts = make_prompts(lens)
    rows = []
    for preset in presets:
        path = write_preset_checkpoint(preset, root)
        want = hf_greedy(path, prompts, max_tokens)
        for backend in backends:
            start = time.perf_counter()
            try:
                got = lenserve_greedy(path, prompts, max_tokens, backend, device)
            except Exception as exc:    # a row of the table, counted as a failure
                row = FamilyCheck(preset, PRESETS[preset].family, backend, device, len(prompts),
                                  0, f"{type(exc).__name__}: {exc}", 0.0)
            else:
                row = compare(preset, PRESETS[preset].family, backend, device, prompts, want,
                              got, time.perf_counter() - start)
            log(f"{preset:>18} {backend:>6}: {row.identical}/{row.prompts} identical"
                + (f" ({row.first_divergence})" if row.first_divergence else ""))
            rows.append(row)
    return rows
