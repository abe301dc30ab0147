"""What distinguishes the Llama-like families, read from a Hugging Face config.

Llama, Mistral, Qwen2/2.5, Qwen3, Phi-3, Gemma 2 and Gemma 3 share one decoder (``llama.py``:
RMSNorm, rotary attention with grouped KV heads, a gated MLP) and differ in a handful of
switches: biases, per-head q/k norms, sliding windows per layer, score and logit soft-caps,
Gemma's (1 + w) norms after each sublayer, scaled embeddings, the activation, fused checkpoint
weights. ``arch_of`` turns a config into those switches; the decoder reads only them.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from services.executor.models.rope import RopeSpec, rope_parameters, rope_spec

# model_type -> the architecture name of its checkpoints, for messages and docs.
ARCHITECTURES = {
    "llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM", "phi3": "Phi3ForCausalLM", "gemma2": "Gemma2ForCausalLM",
    "gemma3_text": "Gemma3ForCausalLM",
}
_GELU_TANH = ("gelu_pytorch_tanh", "gelu_tanh")


@dataclass(frozen=True)
class Arch:
    family: str
    hidden: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate: int
    vocab_size: int
    eps: float
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False           # RMSNorm over each head of q and k before RoPE (Qwen3, Gemma 3)
    gemma_norm: bool = False        # weight stored as w - 1, all in float32 (Gemma)
    sandwich: bool = False          # norms after attention and MLP as well (Gemma 2/3)
    gelu: bool = False              # GeGLU (tanh GELU) instead of SwiGLU
    embed_scale: float = 0.0        # embeddings times sqrt(hidden) (Gemma); 0: none
    attn_scale: float = 0.0         # 0: head_dim ** -0.5
    attn_softcap: float = 0.0
    final_softcap: float = 0.0
    windows: tuple[int, ...] = ()   # per layer; 0 = full attention
    layer_rope: tuple = ()          # per layer: its key in ``ropes``
    ropes: dict = field(default_factory=dict, compare=False)   # key -> RopeSpec
    fused_checkpoint: bool = False  # the checkpoint already holds qkv_proj / gate_up_proj (Phi-3)
    tied: bool = False

    @property
    def plain_rope(self) -> bool:
        """One full-width rope for every layer and no q/k norm: the fused GPU kernel's case."""
        specs: list[RopeSpec] = list(self.ropes.values())
        return (len(specs) == 1 and specs[0].rotary_dim == self.head_dim
                and not self.qk_norm)


def supported_message() -> str:
    from services.executor.models.loader import FAMILIES
    names = [f"{t} ({ARCHITECTURES.get(t, 'OPTForCausalLM')})" for t in sorted(FAMILIES)]
    return ", ".join(names)


def _layer_windows(cfg, num_layers: int) -> tuple[int, ...]:
    """Hugging Face's rule: ``layer_types`` says which layers slide (Qwen, Gemma); without it
    every layer does when ``sliding_window`` is set (Mistral, Phi-3)."""
    window = int(getattr(cfg, "sliding_window", None) or 0)
    types = getattr(cfg, "layer_types", None)
    if types:
        return tuple(window if t == "sliding_attention" else 0 for t in types[:num_layers])
    return (window,) * num_layers


def _activation(cfg) -> bool:
    act = getattr(cfg, "hidden_activation", None) or getattr(cfg, "hidden_act", "silu")
    if act not in ("silu", *_GELU_TANH):
        raise ValueError(f"activation {act!r} is not supported (silu or gelu_pytorch_tanh)")
    return act in _GELU_TANH


def arch_of(cfg) -> Arch:
    family = cfg.model_type
    if family not in ARCHITECTURES:
        raise ValueError(f"model type {family!r} is not a Llama-like family")
    num_heads = cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // num_heads
    num_layers = cfg.num_hidden_layers
    params = rope_parameters(cfg)
    ropes = {key: rope_spec(cfg, p, head_dim) for key, p in params.items()}
    types = getattr(cfg, "layer_types", None) or [None] * num_layers
    layer_rope = tuple(t if t in ropes else None for t in types[:num_layers])
    bias = bool(getattr(cfg, "attention_bias", False))
    common = dict(
        family=family, hidden=cfg.hidden_size, num_layers=num_layers, num_heads=num_heads,
        num_kv_heads=getattr(cfg, "num_key_value_heads", None) or num_heads, head_dim=head_dim,
        intermediate=cfg.intermediate_size, vocab_size=cfg.vocab_size, eps=cfg.rms_norm_eps,
        qkv_bias=bias, o_bias=bias, mlp_bias=bool(getattr(cfg, "mlp_bias", False)),
        gelu=_activation(cfg), windows=_layer_windows(cfg, num_layers), layer_rope=layer_rope,
        ropes=ropes, tied=bool(getattr(cfg, "tie_word_embeddings", False)))
    if family == "qwen2":
        common.update(qkv_bias=True, o_bias=False)
    elif family == "qwen3":
        common.update(qk_norm=True)
    elif family == "phi3":
        common.update(fused_checkpoint=True, qkv_bias=False, o_bias=False)
    elif family in ("gemma2", "gemma3_text"):
        common.update(gemma_norm=True, sandwich=True, embed_scale=cfg.hidden_size ** 0.5,
                      attn_scale=cfg.query_pre_attn_scalar ** -0.5,
                      attn_softcap=float(getattr(cfg, "attn_logit_softcapping", None) or 0.0),
                      final_softcap=float(getattr(cfg, "final_logit_softcapping", None) or 0.0),
                      qk_norm=family == "gemma3_text")
    return Arch(**common)
