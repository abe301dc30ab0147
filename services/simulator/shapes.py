"""Model shapes: what the cost models and the simulated KV pool need to know of a model,
without its weights. The papers' models are listed from their published configs."""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


@dataclass(frozen=True)
class ModelShape:
    name: str
    family: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    ffn_size: int
    vocab_size: int
    max_model_len: int
    dtype: str = "float16"
    eos_token_id: int | None = None
    ffn_matrices: int = 2           # 2 for OPT's fc1/fc2, 3 for Llama's gate/up/down

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def layer_params(self) -> int:
        h, kv = self.hidden_size, self.num_kv_heads * self.head_dim
        attention = h * self.num_heads * self.head_dim * 2 + h * kv * 2
        return attention + self.ffn_matrices * h * self.ffn_size

    @property
    def dense_params(self) -> int:
        """Weights every fed token passes through (all layers, not the embeddings)."""
        return self.num_layers * self.layer_params

    @property
    def weight_bytes(self) -> int:
        # Embeddings and the LM head counted once each (untied in Llama-2; OPT ties them, a
        # difference of 1-2% of the 13B model that the estimate does not chase).
        return (self.dense_params + 2 * self.vocab_size * self.hidden_size) * self.dtype_bytes

    def kv_bytes_per_token(self) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> ModelShape:
        names = {f.name for f in fields(cls)}
        missing = names - set(data) - {"dtype", "eos_token_id", "ffn_matrices"}
        if missing:
            raise ValueError(f"model shape lacks {sorted(missing)}")
        return cls(**{k: v for k, v in data.items() if k in names})


def _llama(name: str, layers: int, hidden: int, heads: int, ffn: int) -> ModelShape:
    return ModelShape(name, "llama", layers, hidden, heads, heads, hidden // heads, ffn,
                      32000, 4096, "float16", 2, ffn_matrices=3)


def _opt(name: str, layers: int, hidden: int, heads: int) -> ModelShape:
    # OPT: ffn 4 x hidden, 50272-token vocabulary, 2048 positions, eos 2 (facebook/opt-* configs).
    return ModelShape(name, "opt", layers, hidden, heads, heads, hidden // heads, 4 * hidden,
                      50272, 2048, "float16", 2)


MODEL_SHAPES: dict[str, ModelShape] = {
    "llama-2-7b": _llama("llama-2-7b", 32, 4096, 32, 11008),
    "llama-2-13b": _llama("llama-2-13b", 40, 5120, 40, 13824),
    # FluidInfer's models (report §6.1) include OPT-125M and OPT-1.3B.
    "opt-125m": _opt("opt-125m", 12, 768, 12),
    "opt-1.3b": _opt("opt-1.3b", 24, 2048, 32),
    "opt-2.7b": _opt("opt-2.7b", 32, 2560, 32),
    "opt-6.7b": _opt("opt-6.7b", 32, 4096, 32),
    "opt-13b": _opt("opt-13b", 40, 5120, 40),
    # The chat models deployed today, from their published config.json (bf16, GQA, untied
    # embeddings): 8.03B and 7.62B parameters.
    "llama-3.1-8b": ModelShape("llama-3.1-8b", "llama", 32, 4096, 32, 8, 128, 14336, 128256,
                               131072, "bfloat16", 128001, ffn_matrices=3),
    "qwen2.5-7b": ModelShape("qwen2.5-7b", "qwen2", 28, 3584, 28, 4, 128, 18944, 152064,
                             32768, "bfloat16", 151643, ffn_matrices=3),
}


def model_shape(name: str) -> ModelShape:
    if name not in MODEL_SHAPES:
        raise ValueError(f"unknown model shape {name!r}; choose one of {sorted(MODEL_SHAPES)}")
    return MODEL_SHAPES[name]
