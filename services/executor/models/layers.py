"""Building blocks shared by the model families, over one flat ragged batch of tokens.

Everything except attention sees ``[num_tokens, hidden]`` with no padding: prompt chunks and
decode tokens of many requests are simply concatenated. Attention is the only step that needs
per-request structure; it reads it from ``AttentionContext``.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from torch import nn

from services.executor.attention.base import AttentionBackend, AttentionMetadata
from services.executor.kv_cache import KVCachePool
from services.executor.models.fused import add_rms_norm, use_fused


@dataclass
class AttentionContext:
    """What every attention layer of one iteration needs.

    ``waves`` splits the batch's sequences into groups that attend one group at a time; a
    memory-bounded scheduler (FluidInfer) uses it to cycle more requests through attention than
    fit at once. ``None`` means one wave with every sequence.
    """

    meta: AttentionMetadata
    slot_mapping: torch.Tensor          # int64 [num_tokens]: where each token's K/V is written
    kv_cache: KVCachePool
    backend: AttentionBackend
    waves: list[list[int]] | None = None
    time_attention: bool = False        # wall-clock timing is only honest without async devices
    attention_s: float = 0.0
    wave_attention_s: list[float] = field(default_factory=list)   # summed over layers
    # Streamed waves (``services/executor/streaming.StreamPlan``): some sequences' KV lives in
    # the host tier; the plan writes and attends resident and streamed waves per layer.
    stream: object | None = None
    _wave_meta: list[tuple[AttentionMetadata, torch.Tensor]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.waves is None:
            return
        flat = sorted(i for wave in self.waves for i in wave)
        if flat != list(range(self.meta.num_seqs)):
            raise ValueError(f"attention waves {self.waves} must cover sequences "
                             f"0..{self.meta.num_seqs - 1} exactly once")
        # Built once per iteration, reused by every layer.
        self._wave_meta = [self.meta.select(wave) for wave in self.waves if wave]
        self.wave_attention_s = [0.0] * len(self._wave_meta)


def paged_attention(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    ctx: AttentionContext, scale: float, window: int = 0,
                    softcap: float = 0.0) -> torch.Tensor:
    """Write this iteration's K/V into the pool, then attend over each request's cached KV
    (``window``, ``softcap``: the layer's sliding window and score cap, 0 for none)."""
    start = time.perf_counter() if ctx.time_attention else 0.0
    if ctx.stream is not None:
        out = ctx.stream.attention(layer, q, k, v, ctx, scale, window, softcap)
    else:
        ctx.kv_cache.write(layer, k, v, ctx.slot_mapping)
        out = attend(layer, q, ctx, scale, window, softcap)
    if ctx.time_attention:
        ctx.attention_s += time.perf_counter() - start
    return out


def attend(layer: int, q: torch.Tensor, ctx: AttentionContext, scale: float, window: int = 0,
           softcap: float = 0.0) -> torch.Tensor:
    """Attention of ``q`` over the cached KV (this iteration's K/V already written)."""
    k_cache, v_cache = ctx.kv_cache.layer(layer)
    opts = {"window": window, "softcap": softcap} if window or softcap else {}
    if ctx.waves is None:
        out = ctx.backend.forward(q, k_cache, v_cache, ctx.meta, scale, **opts)
    else:
        out = torch.empty_like(q)
        for i, (sub, rows) in enumerate(ctx._wave_meta):
            t0 = time.perf_counter() if ctx.time_attention else 0.0
            out[rows] = ctx.backend.forward(q[rows], k_cache, v_cache, sub, scale, **opts)
            if ctx.time_attention:
                ctx.wave_attention_s[i] += time.perf_counter() - t0
    return out


class RMSNorm(nn.Module):
    """Normalises in float32 and casts back before the weight, exactly as Hugging Face Llama.

    With ``residual`` it first adds it (the decoder's skip connection) and returns the sum as
    well: one fused kernel on a GPU instead of an add and five normalisation kernels."""

    def __init__(self, hidden: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden))
        self.eps = eps

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        if use_fused(x):
            out, summed = add_rms_norm(x, residual, self.weight, self.eps)
            return out if residual is None else (out, summed)
        if residual is None:
            return self.norm(x)
        summed = x + residual
        return self.norm(summed), summed

    def norm(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float,
                 dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """``cos, sin[num_tokens, head_dim]`` of plain RoPE (``rope.rope_cos_sin`` for the others)."""
    from services.executor.models import rope

    spec = rope.rope_spec(None, {"rope_theta": theta}, head_dim)
    return rope.rope_cos_sin(positions, spec, dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x[num_tokens, heads, head_dim]`` by per-token angles; with partial rotary
    (``cos`` narrower than ``head_dim``) the remaining features pass through."""
    dim = cos.shape[-1]
    if dim < x.shape[-1]:
        return torch.cat((apply_rope(x[..., :dim], cos, sin), x[..., dim:]), dim=-1)
    half = dim // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]


def fuse_weights(weights: dict[str, torch.Tensor], prefix: str, parts: list[str],
                 fused: str) -> None:
    """Concatenate checkpoint projections into one (q, k, v -> qkv), in place in ``weights``."""
    for kind in ("weight", "bias"):
        names = [f"{prefix}{p}.{kind}" for p in parts]
        present = [n in weights for n in names]
        if not any(present) and kind == "bias":
            continue
        if not all(present):
            raise ValueError(f"checkpoint lacks {[n for n, ok in zip(names, present) if not ok]}")
        weights[f"{prefix}{fused}.{kind}"] = torch.cat([weights.pop(n) for n in names], dim=0)


def load_params(module: nn.Module, tensors: dict[str, torch.Tensor]) -> None:
    """Copy named tensors into ``module``'s parameters; every parameter must be covered."""
    params = dict(module.named_parameters())
    missing = sorted(set(params) - set(tensors))
    if missing:
        raise ValueError(f"checkpoint lacks weights for {missing[:5]}")
    with torch.no_grad():
        for name, tensor in tensors.items():
            if name not in params:
                raise ValueError(f"checkpoint weight {name!r} has no place in the model")
            if params[name].shape != tensor.shape:
                raise ValueError(f"checkpoint weight {name!r} has shape {tuple(tensor.shape)}, "
                                 f"the model expects {tuple(params[name].shape)}")
            params[name].copy_(tensor)
