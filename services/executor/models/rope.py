"""Rotary position embeddings of every supported ``rope_type``: plain, linear, Llama 3, YaRN.

A config's ``rope_parameters`` (or the older ``rope_theta`` / ``rope_scaling``) give each layer
type its rotary frequencies; Gemma 3 has two (local layers at base 10k, global at 1M). Each
type's ``inv_freq`` is computed once, at load, in float32 and in the same order of operations
as Hugging Face's initialisers, so the angles (and greedy outputs) match it exactly. Partial
rotary (``partial_rotary_factor`` < 1, Phi) rotates the first ``rotary_dim`` features only.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn")


@dataclass(frozen=True)
class RopeSpec:
    inv_freq: torch.Tensor          # float32 [rotary_dim // 2]
    attention_scaling: float        # cos and sin are multiplied by it (YaRN's mscale)
    rotary_dim: int


def rope_parameters(cfg) -> dict:
    """``{layer_type or None: parameters}`` from either config style."""
    params = getattr(cfg, "rope_parameters", None)
    if params and all(isinstance(v, dict) for v in params.values()):
        return dict(params)     # per layer type (Gemma 3)
    params = dict(params or {})
    scaling = getattr(cfg, "rope_scaling", None) or {}
    if not params.get("rope_type"):
        params.update(scaling)
        params.setdefault("rope_type", scaling.get("type", "default"))
    params.setdefault("rope_theta", getattr(cfg, "rope_theta", None) or 10000.0)
    return {None: params}


def rope_spec(cfg, params: dict, head_dim: int) -> RopeSpec:
    kind = params.get("rope_type") or params.get("type") or "default"
    if kind not in SUPPORTED_ROPE_TYPES:
        raise ValueError(f"rope type {kind!r} is not supported: lenserve implements "
                         f"{', '.join(SUPPORTED_ROPE_TYPES)}")
    base = float(params.get("rope_theta") or 10000.0)
    dim = int(head_dim * float(params.get("partial_rotary_factor") or 1.0))
    # On the CPU explicitly: models are built under torch.device("meta").
    exponents = torch.arange(0, dim, 2, dtype=torch.int64, device="cpu").float() / dim
    inv_freq = 1.0 / (base ** exponents)
    scaling = 1.0
    if kind == "linear":
        inv_freq = inv_freq / params["factor"]
    elif kind == "llama3":
        inv_freq = _llama3(inv_freq, params)
    elif kind == "yarn":
        inv_freq, scaling = _yarn(base ** exponents, dim, base, params,
                                  int(getattr(cfg, "max_position_embeddings", 0) or 0))
    return RopeSpec(inv_freq, float(scaling), dim)


def _llama3(inv_freq: torch.Tensor, p: dict) -> torch.Tensor:
    """Llama 3.1: long wavelengths slowed by ``factor``, short ones kept, a smooth ramp
    between."""
    factor, low, high = p["factor"], p["low_freq_factor"], p["high_freq_factor"]
    old_len = p["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


def _yarn(pos_freqs: torch.Tensor, dim: int, base: float, p: dict,
          max_positions: int) -> tuple[torch.Tensor, float]:
    """YaRN: interpolate the low frequencies by ``factor``, keep the high ones, ramp between
    ``beta_fast`` and ``beta_slow`` rotations; cos/sin scaled by ``0.1 ln(factor) + 1``."""
    old_len = p["original_max_position_embeddings"]
    factor = p.get("factor") or max_positions / old_len

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention = p.get("attention_factor")
    if attention is None:
        m, m_all = p.get("mscale"), p.get("mscale_all_dim")
        attention = float(mscale(factor, m) / mscale(factor, m_all)) if m and m_all \
            else mscale(factor)
    beta_fast, beta_slow = p.get("beta_fast") or 32, p.get("beta_slow") or 1

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(old_len / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if p.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001   # no singular ramp
    steps = torch.arange(dim // 2, dtype=torch.float32, device="cpu")
    ramp = torch.clamp((steps - low) / (high - low), 0, 1)
    extrapolation = 1 - ramp
    inv_freq = (1.0 / (factor * pos_freqs)) * (1 - extrapolation) \
        + (1.0 / pos_freqs) * extrapolation
    return inv_freq, attention


def rope_cos_sin(positions: torch.Tensor, spec: RopeSpec, dtype: torch.dtype,
                 inv_freq: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``cos, sin[num_tokens, rotary_dim]`` for the rotate-half layout of Hugging Face;
    ``inv_freq``: ``spec.inv_freq`` already on the positions' device (no copy in a CUDA graph)."""
    inv_freq = spec.inv_freq.to(positions.device) if inv_freq is None else inv_freq
    freqs = positions.float()[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()
    if spec.attention_scaling != 1.0:
        cos, sin = cos * spec.attention_scaling, sin * spec.attention_scaling
    return cos.to(dtype), sin.to(dtype)
