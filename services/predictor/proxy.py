"""The proxy-model baseline of S3/SSJF: a small BERT-style encoder (MiniLM) fine-tuned with a
regression head on log output length. Every prediction runs the whole encoder, which is the
cost ALISE's retrieval avoids."""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from services.predictor.learning import TrainingStopped
from services.predictor.packed_encoder import mean_pooled, packable

log = logging.getLogger(__name__)
# Progress lines per epoch while fine-tuning (minutes per epoch on a CPU).
PROGRESS_LINES = 10


@dataclass(frozen=True)
class ProxyConfig:
    encoder_path: str | None = None
    max_seq_length: int = 64
    epochs: int = 2
    batch_size: int = 16
    lr: float = 5e-5
    head_lr: float = 1e-3
    seed: int = 0
    # Keep only the encoder's first this many transformer layers (0 = all): a fine-tuned
    # shallower encoder reads a longer window for the same cost per prompt.
    num_layers: int = 0
    # Run a BERT encoder on each batch's real tokens only (False: padded, as transformers does).
    packed: bool = True


class ProxyRegressor(nn.Module):
    def __init__(self, config: ProxyConfig):
        super().__init__()
        from transformers import AutoModel, AutoTokenizer

        from services.predictor.embedder import default_encoder_path

        path = config.encoder_path or default_encoder_path()
        self.config = config
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.encoder = AutoModel.from_pretrained(path)
        if config.num_layers:
            truncate_layers(self.encoder, config.num_layers)
        self.head = nn.Linear(self.encoder.config.hidden_size, 1)
        # A BERT runs packed (packed_encoder.py): the dense layers on the batch's real tokens
        # only, in training (with dropout) as in prediction; other encoders run padded.
        self.packed = config.packed and packable(self.encoder)

    def forward(self, prompts: list[str]) -> torch.Tensor:
        batch = self.tokenizer(prompts, padding=True, truncation=True,
                               max_length=self.config.max_seq_length, return_tensors="pt")
        if self.packed:
            pooled = mean_pooled(self.encoder, batch["input_ids"], batch["attention_mask"],
                                 batch.get("token_type_ids"))
        else:
            hidden = self.encoder(**batch).last_hidden_state
            mask = batch["attention_mask"].unsqueeze(-1).float()
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1.0)
        return self.head(pooled).squeeze(-1)

    def fit(self, prompts: list[str], lengths: list[int], stop=None) -> ProxyRegressor:
        """Train on (prompt, length) pairs; ``stop`` (an Event): once set, training ends
        within a batch with ``learning.TrainingStopped``."""
        torch.manual_seed(self.config.seed)
        gen = torch.Generator().manual_seed(self.config.seed)
        y = torch.log1p(torch.tensor(lengths, dtype=torch.float32))
        # Start the head at the mean so early steps tune the encoder, not a bias offset.
        nn.init.zeros_(self.head.weight)
        nn.init.constant_(self.head.bias, float(y.mean()))
        opt = torch.optim.AdamW([{"params": self.encoder.parameters(), "lr": self.config.lr},
                                 {"params": self.head.parameters(), "lr": self.config.head_lr}])
        self.train()
        t0 = time.perf_counter()
        for epoch in range(self.config.epochs):
            batches = torch.randperm(len(prompts), generator=gen).split(self.config.batch_size)
            every = max(1, len(batches) // PROGRESS_LINES)
            for b, idx in enumerate(batches):
                if stop is not None and stop.is_set():
                    raise TrainingStopped("fine-tune stopped")
                loss = nn.functional.smooth_l1_loss(self([prompts[i] for i in idx]), y[idx])
                opt.zero_grad()
                loss.backward()
                opt.step()
                if (b + 1) % every == 0 or b + 1 == len(batches):
                    done = min(len(prompts), (b + 1) * self.config.batch_size)
                    log.info("fine-tune epoch %d/%d: %d/%d records, loss %.3f, %.0fs",
                             epoch + 1, self.config.epochs, done, len(prompts), loss.item(),
                             time.perf_counter() - t0)
        return self.eval()

    def predict(self, prompts: list[str], batch_size: int = 64) -> np.ndarray:
        out = []
        with torch.inference_mode():
            for i in range(0, len(prompts), batch_size):
                out.append(self(prompts[i:i + batch_size]).numpy())
        return np.expm1(np.concatenate(out)).clip(min=1.0)


def truncate_layers(encoder: nn.Module, num_layers: int) -> None:
    """Drop a BERT-style encoder's top layers in place; its config then saves the new depth."""
    layers = getattr(getattr(encoder, "encoder", None), "layer", None)
    if not isinstance(layers, nn.ModuleList):
        raise ValueError(f"cannot truncate {type(encoder).__name__}: not a BERT-style encoder")
    if not 0 < num_layers <= len(layers):
        raise ValueError(f"num_layers must be in 1..{len(layers)}, got {num_layers}")
    encoder.encoder.layer = layers[:num_layers]
    encoder.config.num_hidden_layers = num_layers
