"""A BERT sentence encoder run on the real tokens of a batch only, without padding.

sentence-transformers pads every prompt of a pass to the pass's longest one. Chat prompts
vary in length (Alpaca's average 17 of a 32-token window, ShareGPT's 35 of 64), so much of a
padded pass multiplies padding. Here the dense layers (QKV, output, feed-forward: nearly all
the arithmetic) run on the batch's tokens packed end to end; only attention, a small share of
the work at these windows, reads a padded grid, and mean pooling sums each prompt's own
tokens. The vectors are sentence-transformers' to float rounding, and the gradients those of
the padded model (tests/predictor/test_packed_encoder.py).

`mean_pooled` runs a transformers BertModel (absolute positions, GELU) this way, with its
dropout where the model is in training mode: the fine-tune (proxy.py) trains through it.
`PackedBert` serves the embedder: it reads the weights of the model sentence-transformers
loaded (any precision: the int8 path's quantised Linear modules are called as they are) and
applies to the stock layout only, Transformer(BertModel) → mean Pooling → Normalize, which is
what all-MiniLM-L6-v2 and every encoder `finetune.py` writes have. `PackedBert.wrap` returns
None for anything else, and the embedder keeps sentence-transformers' own passes.
"""
from __future__ import annotations

# Tokens per pass: passes of length-sorted prompts keep the attention grid tight in bulk
# encodes (seeding); a served batch of 32 chat prompts fits in one.
PASS_TOKENS = 4096


def packable(bert) -> bool:
    """Whether `mean_pooled` computes what `bert` (a transformers model) computes."""
    cfg = getattr(bert, "config", None)
    return cfg is not None and cfg.model_type == "bert" and cfg.hidden_act == "gelu" \
        and getattr(cfg, "position_embedding_type", "absolute") == "absolute" \
        and not cfg.is_decoder


def mean_pooled(bert, input_ids, attention_mask, token_type_ids=None):
    """The mean over each row's real tokens of `bert`'s last hidden states, (rows, hidden)
    float32, from the padded tokenizer output of a batch: what `bert(...)` and masked mean
    pooling give, with the dense layers run on the real tokens only. Differentiable, and with
    the model's dropout where it is in training mode (the fine-tune, proxy.py)."""
    import torch
    import torch.nn.functional as F

    cfg = bert.config
    heads, width = cfg.num_attention_heads, cfg.hidden_size
    mask = attention_mask.bool()
    lens = mask.sum(1)
    n, grid_len = len(lens), int(lens.max())
    mask = mask[:, :grid_len]
    positions = torch.arange(grid_len).expand(n, grid_len)[mask]
    types = token_type_ids[:, :grid_len][mask] if token_type_ids is not None \
        else torch.zeros_like(positions)
    emb = bert.embeddings
    x = emb.word_embeddings(input_ids[:, :grid_len][mask]) + emb.position_embeddings(positions) \
        + emb.token_type_embeddings(types)
    x = emb.dropout(emb.LayerNorm(x))
    # Where each packed token sits in the padded [n, grid_len] grid attention reads.
    slots = mask.reshape(-1).nonzero().squeeze(1)
    blocked = torch.zeros(n, 1, 1, grid_len, dtype=x.dtype).masked_fill(
        ~mask[:, None, None, :], float("-inf"))
    attention_dropout = cfg.attention_probs_dropout_prob if bert.training else 0.0

    def grid(t):
        # [tokens, width] -> [n, heads, grid_len, head_dim], zeros at the padding.
        g = t.new_zeros(n * grid_len, width)
        g[slots] = t
        return g.view(n, grid_len, heads, width // heads).transpose(1, 2)

    for layer in bert.encoder.layer:
        att = layer.attention
        ctx = F.scaled_dot_product_attention(
            grid(att.self.query(x)), grid(att.self.key(x)), grid(att.self.value(x)),
            attn_mask=blocked, dropout_p=attention_dropout)
        ctx = ctx.transpose(1, 2).reshape(n * grid_len, width)[slots]
        x = att.output.LayerNorm(att.output.dropout(att.output.dense(ctx)) + x)
        x = layer.output.LayerNorm(
            layer.output.dropout(layer.output.dense(F.gelu(layer.intermediate.dense(x)))) + x)
    seq = torch.repeat_interleave(torch.arange(n), lens)
    pooled = torch.zeros(n, width, dtype=torch.float32).index_add(0, seq, x.float())
    return pooled / lens[:, None].to(torch.float32)


class PackedBert:
    """Unit-norm sentence vectors of a sentence-transformers model of the stock layout."""

    def __init__(self, st_model):
        self.st = st_model
        self.bert = st_model[0].auto_model

    @classmethod
    def wrap(cls, st_model) -> PackedBert | None:
        """The packed runner for a sentence-transformers model of the stock layout, else None."""
        try:
            modules = list(st_model)
        except TypeError:
            return None
        if len(modules) != 3 or [type(m).__name__ for m in modules] != \
                ["Transformer", "Pooling", "Normalize"]:
            return None
        pooling = modules[1].get_config_dict()
        if pooling.get("pooling_mode", "mean") != "mean" or not pooling.get("include_prompt", True):
            return None
        return cls(st_model) if packable(getattr(modules[0], "auto_model", None)) else None

    def encode(self, texts: list[str]):
        """(len(texts), hidden) float32 tensor of unit-norm sentence vectors, in input order."""
        import torch

        if not texts:
            return torch.zeros(0, self.bert.config.hidden_size)
        # sentence-transformers' own tokenisation (its `preprocess`, `tokenize` before v6).
        tokenize = getattr(self.st, "preprocess", None) or self.st.tokenize
        features = tokenize(texts)
        ids, mask = features["input_ids"], features["attention_mask"]
        types = features.get("token_type_ids")
        lens = mask.sum(1)
        order = torch.argsort(lens, descending=True, stable=True)
        out = torch.empty(len(texts), self.bert.config.hidden_size)
        start = 0
        with torch.inference_mode():
            while start < len(texts):
                # Sorted longest first, so the first prompt of a pass sets its grid's width.
                per = max(1, PASS_TOKENS // max(1, int(lens[order[start]])))
                idx = order[start:start + per]
                out[idx] = mean_pooled(self.bert, ids[idx], mask[idx],
                                       None if types is None else types[idx])
                start += per
        return torch.nn.functional.normalize(out, dim=1)
