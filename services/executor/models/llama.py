"""Llama over a flat ragged batch: RoPE, RMSNorm, SwiGLU MLP, grouped-query attention.

Module names follow the Hugging Face checkpoint (minus ``model.``) except the fused
``qkv_proj`` and ``gate_up_proj``: one matmul each instead of three and two.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from services.executor.models.fused import rope_and_cache, silu_and_mul, use_fused
from services.executor.models.layers import (
    AttentionContext,
    RMSNorm,
    apply_rope,
    attend,
    fuse_weights,
    load_params,
    paged_attention,
    rope_cos_sin,
)


def rope_theta(cfg) -> float:
    """RoPE base from either config style (``rope_parameters`` or ``rope_theta``/``rope_scaling``);
    only plain RoPE is implemented, so any scaling is refused rather than silently ignored."""
    params = getattr(cfg, "rope_parameters", None) or {}
    scaling = getattr(cfg, "rope_scaling", None) or {}
    kind = params.get("rope_type") or scaling.get("rope_type") or scaling.get("type") or "default"
    if kind != "default":
        raise ValueError(f"Llama rope type {kind!r} is not supported (only plain RoPE)")
    return float(params.get("rope_theta") or getattr(cfg, "rope_theta", None) or 10000.0)


@dataclass
class Rope:
    """Rotary angles of one iteration: per token ``[T, D]`` (unfused), or the whole
    ``[max_positions, D]`` tables that the fused kernel indexes by ``positions``."""

    positions: torch.Tensor
    cos: torch.Tensor
    sin: torch.Tensor
    fused: bool


class LlamaAttention(nn.Module):
    def __init__(self, cfg, layer: int):
        super().__init__()
        self.layer = layer
        self.num_heads = cfg.num_attention_heads
        self.num_kv_heads = cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.num_heads
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.sizes = [q_size, kv_size, kv_size]
        self.qkv_proj = nn.Linear(cfg.hidden_size, q_size + 2 * kv_size, bias=cfg.attention_bias)
        self.o_proj = nn.Linear(q_size, cfg.hidden_size, bias=cfg.attention_bias)

    def forward(self, x: torch.Tensor, rope: Rope, ctx: AttentionContext) -> torch.Tensor:
        n = x.shape[0]
        qkv = self.qkv_proj(x)
        scale = self.head_dim ** -0.5
        if rope.fused:
            k_cache, v_cache = ctx.kv_cache.layer(self.layer)
            q = rope_and_cache(qkv, rope.positions, rope.cos, rope.sin, ctx.slot_mapping,
                               k_cache, v_cache, self.num_heads, self.num_kv_heads,
                               self.head_dim)
            return self.o_proj(attend(self.layer, q, ctx, scale).reshape(n, -1))
        cos, sin = rope.cos, rope.sin
        q, k, v = qkv.split(self.sizes, dim=-1)
        q = apply_rope(q.view(n, self.num_heads, self.head_dim), cos, sin)
        k = apply_rope(k.view(n, self.num_kv_heads, self.head_dim), cos, sin)
        v = v.view(n, self.num_kv_heads, self.head_dim)
        out = paged_attention(self.layer, q, k, v, ctx, scale)
        return self.o_proj(out.reshape(n, -1))


class LlamaMLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        if cfg.hidden_act != "silu":
            raise ValueError(f"Llama activation {cfg.hidden_act!r} is not supported (only 'silu')")
        self.intermediate = cfg.intermediate_size
        self.gate_up_proj = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=cfg.mlp_bias)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=cfg.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = self.gate_up_proj(x)
        if use_fused(gate_up):
            return self.down_proj(silu_and_mul(gate_up))
        gate, up = gate_up.split(self.intermediate, dim=-1)
        return self.down_proj(nn.functional.silu(gate) * up)


class LlamaDecoderLayer(nn.Module):
    def __init__(self, cfg, layer: int):
        super().__init__()
        self.self_attn = LlamaAttention(cfg, layer)
        self.mlp = LlamaMLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None, rope: Rope,
                ctx: AttentionContext) -> tuple[torch.Tensor, torch.Tensor]:
        """``x`` is the previous sublayer's output, ``residual`` the running sum before it
        (None at the first layer): the skip additions happen inside the norms, as
        ``residual + sublayer(norm(residual))`` in the unfused order."""
        if residual is None:
            residual, h = x, self.input_layernorm(x)
        else:
            h, residual = self.input_layernorm(x, residual)
        h, residual = self.post_attention_layernorm(self.self_attn(h, rope, ctx), residual)
        return self.mlp(h), residual


class LlamaForCausalLM(nn.Module):
    family = "llama"

    def __init__(self, cfg):
        super().__init__()
        self.num_layers = cfg.num_hidden_layers
        self.num_heads = cfg.num_attention_heads
        self.num_kv_heads = cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.num_heads
        self.vocab_size = cfg.vocab_size
        self.rope_theta = rope_theta(cfg)
        self.max_positions = cfg.max_position_embeddings
        self._rope_tables: dict = {}
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(LlamaDecoderLayer(cfg, i) for i in range(self.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.tied = bool(getattr(cfg, "tie_word_embeddings", False))
        self.lm_head = None if self.tied else nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                ctx: AttentionContext) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        rope = self.rope(positions, x)
        residual = None
        for layer in self.layers:
            x, residual = layer(x, residual, rope, ctx)
        return self.norm(x) if residual is None else self.norm(x, residual)[0]

    def rope(self, positions: torch.Tensor, x: torch.Tensor) -> Rope:
        if not use_fused(x):
            # Angles are computed once per iteration and shared by all layers.
            cos, sin = rope_cos_sin(positions, self.head_dim, self.rope_theta, x.dtype)
            return Rope(positions, cos, sin, fused=False)
        key = (x.device, x.dtype)
        if self._rope_tables.get("key") != key:
            # Every position's angles once, by the same code as the per-iteration path, so the
            # fused kernel reads exactly the values the unfused one computes.
            table = torch.arange(self.max_positions, device=x.device)
            cos, sin = rope_cos_sin(table, self.head_dim, self.rope_theta, x.dtype)
            self._rope_tables = {"key": key, "cos": cos, "sin": sin}
        return Rope(positions, self._rope_tables["cos"], self._rope_tables["sin"], fused=True)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        weight = self.embed_tokens.weight if self.tied else self.lm_head.weight
        return hidden @ weight.t()

    def load_hf_weights(self, weights: dict[str, torch.Tensor]) -> None:
        out = {n.removeprefix("model."): t for n, t in weights.items()}
        if self.tied:
            out.pop("lm_head.weight", None)
        for i in range(self.num_layers):
            fuse_weights(out, f"layers.{i}.self_attn.", ["q_proj", "k_proj", "v_proj"], "qkv_proj")
            fuse_weights(out, f"layers.{i}.mlp.", ["gate_proj", "up_proj"], "gate_up_proj")
        out = {n: t for n, t in out.items() if "rotary_emb" not in n}
        load_params(self, out)
