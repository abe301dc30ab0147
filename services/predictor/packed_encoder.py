"""A BERT sentence encoder run on the real tokens of a batch only, without padding.

sentence-transformers pads every prompt of a pass to the pass's longest one. Chat prompts
vary in length (Alpaca's average 17 of a 32-token window), so most of a padded pass multiplies
padding. Here the dense layers (QKV, output, feed-forward: nearly all the arithmetic) run on
the batch's tokens packed end to end; only attention, a small share of the work at these
windows, reads a padded grid, and mean pooling sums each prompt's own tokens. The vectors are
sentence-transformers' to float rounding (tests/predictor/test_packed_encoder.py).

It reads the weights of the model sentence-transformers loaded (any precision: the int8 path's
quantised Linear modules are called as they are) and applies to the stock layout only:
Transformer(BertModel with absolute positions and GELU) → mean Pooling → Normalize, which is
what all-MiniLM-L6-v2 and every encoder `finetune.py` writes have. `PackedBert.wrap` returns
None for anything else, and the embedder keeps sentence-transformers' own passes.
"""
from __future__ import annotations

# Tokens per pass: passes of length-sorted prompts keep the attention grid tight in bulk
# encodes (seeding); a served batch of 32 chat prompts fits in one.
PASS_TOKENS = 4096


class PackedBert:
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
        bert = getattr(modules[0], "auto_model", None)
        cfg = getattr(bert, "config", None)
        if cfg is None or cfg.model_type != "bert" or cfg.hidden_act != "gelu" \
                or getattr(cfg, "position_embedding_type", "absolute") != "absolute" \
                or cfg.is_decoder:
            return None
        return cls(st_model)

    def encode(self, texts: list[str]):
        """(len(texts), hidden) float32 tensor of unit-norm sentence vectors, in input order."""
        import torch

        if not texts:
            return torch.zeros(0, self.bert.config.hidden_size)
        # sentence-transformers' own tokenisation (its `preprocess`, `tokenize` before v6).
        tokenize = getattr(self.st, "preprocess", None) or self.st.tokenize
        features = tokenize(texts)
        mask = features["attention_mask"].bool()
        lens = mask.sum(1)
        order = torch.argsort(lens, descending=True, stable=True)
        out = torch.empty(len(texts), self.bert.config.hidden_size)
        start = 0
        while start < len(texts):
            # Sorted longest first, so the first prompt of a pass sets its grid's width.
            per = max(1, PASS_TOKENS // max(1, int(lens[order[start]])))
            idx = order[start:start + per]
            out[idx] = self._pass(features["input_ids"][idx], features.get("token_type_ids"),
                                  idx, mask[idx], lens[idx])
            start += per
        return torch.nn.functional.normalize(out, dim=1)

    def _pass(self, ids, token_types, idx, mask, lens):
        import torch
        import torch.nn.functional as F

        bert = self.bert
        cfg = bert.config
        heads, width = cfg.num_attention_heads, cfg.hidden_size
        n, grid_len = len(lens), int(lens.max())
        mask = mask[:, :grid_len]
        positions = torch.arange(grid_len).expand(n, grid_len)[mask]
        types = token_types[idx][:, :grid_len][mask] if token_types is not None \
            else torch.zeros_like(positions)
        emb = bert.embeddings
        with torch.inference_mode():
            x = emb.word_embeddings(ids[:, :grid_len][mask]) + emb.position_embeddings(positions) \
                + emb.token_type_embeddings(types)
            x = emb.LayerNorm(x)
            # Where each packed token sits in the padded [n, grid_len] grid attention reads.
            slots = mask.reshape(-1).nonzero().squeeze(1)
            blocked = torch.zeros(n, 1, 1, grid_len, dtype=x.dtype).masked_fill(
                ~mask[:, None, None, :], float("-inf"))
            for layer in bert.encoder.layer:
                att = layer.attention
                q, k, v = (self._grid(lin(x), slots, n, grid_len, heads)
                           for lin in (att.self.query, att.self.key, att.self.value))
                ctx = F.scaled_dot_product_attention(q, k, v, attn_mask=blocked)
                ctx = ctx.transpose(1, 2).reshape(n * grid_len, width)[slots]
                x = att.output.LayerNorm(att.output.dense(ctx) + x)
                x = layer.output.LayerNorm(
                    layer.output.dense(F.gelu(layer.intermediate.dense(x))) + x)
            seq = torch.repeat_interleave(torch.arange(n), lens)
            pooled = torch.zeros(n, width, dtype=torch.float32).index_add_(0, seq, x.float())
            return pooled / lens[:, None].to(torch.float32)

    @staticmethod
    def _grid(t, slots, n, grid_len, heads):
        # [tokens, width] → [n, heads, grid_len, head_dim], zeros at the padding.
        width = t.shape[1]
        grid = t.new_zeros(n * grid_len, width)
        grid[slots] = t
        return grid.view(n, grid_len, heads, width // heads).transpose(1, 2)
