"""The Llama-like decoder over a flat ragged batch: RoPE, RMSNorm, gated MLP, grouped-query
attention, plus the switches of ``arch.Arch`` that make it Mistral, Qwen2/3, Phi-3 or Gemma 2/3.

Module names follow the Hugging Face checkpoint (minus ``model.``) except the fused
``qkv_proj`` and ``gate_up_proj``: one matmul each instead of three and two (Phi-3 checkpoints
store them fused already).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from services.executor.models.arch import Arch, arch_of
from services.executor.models.fused import rope_and_cache, silu_and_mul, use_fused
from services.executor.models.layers import (
    AttentionContext,
    RMSNorm,
    apply_rope,
    attend,
    fuse_weights,
    load_params,
    paged_attention,
)
from services.executor.models.rope import rope_cos_sin


@dataclass
class Rope:
    """Rotary angles of one iteration: per token ``[T, D]`` (unfused), or the whole
    ``[max_positions, D]`` tables that the fused kernel indexes by ``positions``."""

    positions: torch.Tensor
    cos: torch.Tensor
    sin: torch.Tensor
    fused: bool


class GemmaRMSNorm(nn.Module):
    """Gemma's norm: the weight is stored as ``w - 1`` and the product is taken in float32
    before the cast back, the order of Hugging Face's Gemma 2/3."""

    def __init__(self, hidden: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(hidden))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return (h * (1.0 + self.weight.float())).type_as(x)


def make_norm(arch: Arch, width: int) -> nn.Module:
    return GemmaRMSNorm(width, arch.eps) if arch.gemma_norm else RMSNorm(width, arch.eps)


def _plain_norm(norm: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return norm(x) if isinstance(norm, GemmaRMSNorm) else norm.norm(x)


class LlamaAttention(nn.Module):
    def __init__(self, arch: Arch, layer: int):
        super().__init__()
        self.layer = layer
        self.num_heads, self.num_kv_heads = arch.num_heads, arch.num_kv_heads
        self.head_dim = arch.head_dim
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.sizes = [q_size, kv_size, kv_size]
        self.qkv_proj = nn.Linear(arch.hidden, q_size + 2 * kv_size, bias=arch.qkv_bias)
        self.o_proj = nn.Linear(q_size, arch.hidden, bias=arch.o_bias)
        self.q_norm = make_norm(arch, self.head_dim) if arch.qk_norm else None
        self.k_norm = make_norm(arch, self.head_dim) if arch.qk_norm else None
        self.scale = arch.attn_scale or self.head_dim ** -0.5
        self.window = arch.windows[layer] if arch.windows else 0
        self.softcap = arch.attn_softcap

    def forward(self, x: torch.Tensor, rope: Rope, ctx: AttentionContext) -> torch.Tensor:
        n = x.shape[0]
        qkv = self.qkv_proj(x)
        if rope.fused:
            k_cache, v_cache = ctx.kv_cache.layer(self.layer)
            q = rope_and_cache(qkv, rope.positions, rope.cos, rope.sin, ctx.slot_mapping,
                               k_cache, v_cache, self.num_heads, self.num_kv_heads,
                               self.head_dim)
            out = attend(self.layer, q, ctx, self.scale, self.window, self.softcap)
            return self.o_proj(out.reshape(n, -1))
        q, k, v = qkv.split(self.sizes, dim=-1)
        q = q.view(n, self.num_heads, self.head_dim)
        k = k.view(n, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = _plain_norm(self.q_norm, q), _plain_norm(self.k_norm, k)
        q, k = apply_rope(q, rope.cos, rope.sin), apply_rope(k, rope.cos, rope.sin)
        v = v.view(n, self.num_kv_heads, self.head_dim)
        out = paged_attention(self.layer, q, k, v, ctx, self.scale, self.window, self.softcap)
        return self.o_proj(out.reshape(n, -1))


class LlamaMLP(nn.Module):
    def __init__(self, arch: Arch):
        super().__init__()
        self.intermediate, self.gelu = arch.intermediate, arch.gelu
        self.gate_up_proj = nn.Linear(arch.hidden, 2 * arch.intermediate, bias=arch.mlp_bias)
        self.down_proj = nn.Linear(arch.intermediate, arch.hidden, bias=arch.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = self.gate_up_proj(x)
        if not self.gelu and use_fused(gate_up):
            return self.down_proj(silu_and_mul(gate_up))
        gate, up = gate_up.split(self.intermediate, dim=-1)
        act = (nn.functional.gelu(gate, approximate="tanh") if self.gelu
               else nn.functional.silu(gate))
        return self.down_proj(act * up)


class LlamaDecoderLayer(nn.Module):
    def __init__(self, arch: Arch, layer: int):
        super().__init__()
        self.self_attn = LlamaAttention(arch, layer)
        self.mlp = LlamaMLP(arch)
        self.input_layernorm = make_norm(arch, arch.hidden)
        self.post_attention_layernorm = make_norm(arch, arch.hidden)

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


class SandwichDecoderLayer(LlamaDecoderLayer):
    """Gemma 2/3: each sublayer's output is normalised again before the skip addition."""

    def __init__(self, arch: Arch, layer: int):
        super().__init__(arch, layer)
        self.pre_feedforward_layernorm = make_norm(arch, arch.hidden)
        self.post_feedforward_layernorm = make_norm(arch, arch.hidden)

    def forward(self, x: torch.Tensor, residual: None, rope: Rope,
                ctx: AttentionContext) -> tuple[torch.Tensor, None]:
        h = self.post_attention_layernorm(self.self_attn(self.input_layernorm(x), rope, ctx))
        x = x + h
        h = self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))
        return x + h, None


class LlamaForCausalLM(nn.Module):
    family = "llama"

    def __init__(self, cfg):
        super().__init__()
        self.arch = arch = arch_of(cfg)
        self.family = arch.family
        self.num_layers, self.num_heads = arch.num_layers, arch.num_heads
        self.num_kv_heads, self.head_dim = arch.num_kv_heads, arch.head_dim
        self.vocab_size = arch.vocab_size
        self.max_positions = cfg.max_position_embeddings
        self._rope_tables: dict = {}
        self._inv_freq: dict = {}       # (rope key, device) -> inv_freq there, filled lazily
        # Rounded to the model dtype first, as Hugging Face's scaled embedding does.
        self._embed_scale: dict = {}
        self.embed_tokens = nn.Embedding(arch.vocab_size, arch.hidden)
        layer_cls = SandwichDecoderLayer if arch.sandwich else LlamaDecoderLayer
        self.layers = nn.ModuleList(layer_cls(arch, i) for i in range(self.num_layers))
        self.norm = make_norm(arch, arch.hidden)
        self.tied = arch.tied
        self.lm_head = None if self.tied else nn.Linear(arch.hidden, arch.vocab_size, bias=False)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                ctx: AttentionContext) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        if self.arch.embed_scale:
            if x.dtype not in self._embed_scale:
                self._embed_scale[x.dtype] = float(torch.tensor(self.arch.embed_scale,
                                                                dtype=x.dtype))
            x = x * self._embed_scale[x.dtype]
        ropes = {key: self.rope(key, positions, x) for key in self.arch.ropes}
        residual = None
        for layer, key in zip(self.layers, self.arch.layer_rope):
            x, residual = layer(x, residual, ropes[key], ctx)
        if residual is not None:
            return self.norm(x, residual)[0]
        return self.norm(x)

    def rope(self, key, positions: torch.Tensor, x: torch.Tensor) -> Rope:
        spec = self.arch.ropes[key]
        if not (self.arch.plain_rope and use_fused(x)):
            # Angles are computed once per iteration and shared by all layers of this type.
            inv = self._inv_freq.get((key, x.device))
            if inv is None:
                inv = self._inv_freq[key, x.device] = spec.inv_freq.to(x.device)
            cos, sin = rope_cos_sin(positions, spec, x.dtype, inv)
            return Rope(positions, cos, sin, fused=False)
        cache_key = (x.device, x.dtype)
        if self._rope_tables.get("key") != cache_key:
            # Every position's angles once, by the same code as the per-iteration path, so the
            # fused kernel reads exactly the values the unfused one computes.
            table = torch.arange(self.max_positions, device=x.device)
            cos, sin = rope_cos_sin(table, spec, x.dtype)
            self._rope_tables = {"key": cache_key, "cos": cos, "sin": sin}
        return Rope(positions, self._rope_tables["cos"], self._rope_tables["sin"], fused=True)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        weight = self.embed_tokens.weight if self.tied else self.lm_head.weight
        logits = hidden @ weight.t()
        cap = self.arch.final_softcap
        return torch.tanh(logits / cap) * cap if cap else logits

    def load_hf_weights(self, weights: dict[str, torch.Tensor]) -> None:
        out = {n.removeprefix("model."): t for n, t in weights.items()}
        if self.tied:
            out.pop("lm_head.weight", None)
        if not self.arch.fused_checkpoint:
            for i in range(self.num_layers):
                fuse_weights(out, f"layers.{i}.self_attn.", ["q_proj", "k_proj", "v_proj"],
                             "qkv_proj")
                fuse_weights(out, f"layers.{i}.mlp.", ["gate_proj", "up_proj"], "gate_up_proj")
        out = {n: t for n, t in out.items() if "rotary_emb" not in n}
        load_params(self, out)
