"""OPT over a flat ragged batch: learned positions (offset 2), LayerNorm, ReLU MLP, tied head.

Module names follow the Hugging Face checkpoint (minus ``model.decoder.``) except the fused
``qkv_proj``, so loading is a rename plus one concatenation per layer.
"""
from __future__ import annotations

import torch
from torch import nn

from services.executor.models.layers import (
    AttentionContext,
    fuse_weights,
    load_params,
    paged_attention,
)

# OPT reserves the first two rows of its position table (a fairseq padding convention).
POSITION_OFFSET = 2


class OPTAttention(nn.Module):
    def __init__(self, cfg, layer: int):
        super().__init__()
        self.layer = layer
        self.num_heads = cfg.num_attention_heads
        self.head_dim = cfg.hidden_size // self.num_heads
        # Hugging Face scales q before attention, not the scores: same order, same rounding.
        self.scaling = self.head_dim ** -0.5
        self.qkv_proj = nn.Linear(cfg.hidden_size, 3 * cfg.hidden_size, bias=cfg.enable_bias)
        self.out_proj = nn.Linear(cfg.hidden_size, cfg.hidden_size, bias=cfg.enable_bias)

    def forward(self, x: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
        q, k, v = self.qkv_proj(x).chunk(3, dim=-1)
        shape = (x.shape[0], self.num_heads, self.head_dim)
        q = (q * self.scaling).view(shape)
        out = paged_attention(self.layer, q, k.view(shape), v.view(shape), ctx, 1.0)
        return self.out_proj(out.reshape(x.shape[0], -1))


class OPTDecoderLayer(nn.Module):
    def __init__(self, cfg, layer: int):
        super().__init__()
        self.pre_norm = cfg.do_layer_norm_before
        affine = cfg.layer_norm_elementwise_affine
        self.self_attn = OPTAttention(cfg, layer)
        self.self_attn_layer_norm = nn.LayerNorm(cfg.hidden_size, elementwise_affine=affine)
        self.fc1 = nn.Linear(cfg.hidden_size, cfg.ffn_dim, bias=cfg.enable_bias)
        self.fc2 = nn.Linear(cfg.ffn_dim, cfg.hidden_size, bias=cfg.enable_bias)
        self.final_layer_norm = nn.LayerNorm(cfg.hidden_size, elementwise_affine=affine)
        if cfg.activation_function != "relu":
            raise ValueError(f"OPT activation {cfg.activation_function!r} is not supported "
                             "(only 'relu')")

    def forward(self, x: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
        h = self.self_attn_layer_norm(x) if self.pre_norm else x
        x = x + self.self_attn(h, ctx)
        if not self.pre_norm:
            x = self.self_attn_layer_norm(x)
        h = self.final_layer_norm(x) if self.pre_norm else x
        x = x + self.fc2(torch.relu(self.fc1(h)))
        return x if self.pre_norm else self.final_layer_norm(x)


class OPTForCausalLM(nn.Module):
    family = "opt"

    def __init__(self, cfg):
        super().__init__()
        self.num_layers = cfg.num_hidden_layers
        self.num_heads = self.num_kv_heads = cfg.num_attention_heads
        self.head_dim = cfg.hidden_size // cfg.num_attention_heads
        self.vocab_size = cfg.vocab_size
        proj = cfg.word_embed_proj_dim
        self.embed_tokens = nn.Embedding(cfg.vocab_size, proj)
        self.embed_positions = nn.Embedding(cfg.max_position_embeddings + POSITION_OFFSET,
                                            cfg.hidden_size)
        # Only checkpoints whose embeddings are narrower than the model (e.g. OPT-350M) project.
        projected = proj != cfg.hidden_size
        self.project_in = nn.Linear(proj, cfg.hidden_size, bias=False) if projected else None
        self.project_out = nn.Linear(cfg.hidden_size, proj, bias=False) if projected else None
        self.layers = nn.ModuleList(OPTDecoderLayer(cfg, i) for i in range(self.num_layers))
        keep_final = (cfg.do_layer_norm_before
                      and not getattr(cfg, "_remove_final_layer_norm", False))
        self.final_layer_norm = (nn.LayerNorm(cfg.hidden_size,
                                              elementwise_affine=cfg.layer_norm_elementwise_affine)
                                 if keep_final else None)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                ctx: AttentionContext) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        if self.project_in is not None:
            x = self.project_in(x)
        x = x + self.embed_positions(positions + POSITION_OFFSET)
        for layer in self.layers:
            x = layer(x, ctx)
        if self.final_layer_norm is not None:
            x = self.final_layer_norm(x)
        return x

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.project_out is not None:
            hidden = self.project_out(hidden)
        # The LM head is tied to the input embeddings in every OPT checkpoint.
        return hidden @ self.embed_tokens.weight.t()

    def load_hf_weights(self, weights: dict[str, torch.Tensor]) -> None:
        load_params(self, _rename(weights, self.num_layers))


def _rename(weights: dict[str, torch.Tensor], num_layers: int) -> dict[str, torch.Tensor]:
    """Strip the checkpoint prefixes, drop the tied head, fuse q/k/v into ``qkv_proj``."""
    out = {}
    for name, tensor in weights.items():
        for prefix in ("model.decoder.", "decoder."):
            if name.startswith(prefix):
                out[name[len(prefix):]] = tensor
    for i in range(num_layers):
        fuse_weights(out, f"layers.{i}.self_attn.", ["q_proj", "k_proj", "v_proj"], "qkv_proj")
    return out
