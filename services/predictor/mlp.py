"""The MLP fallback: embedding → log output length, trained from the DB's contents.

Served weights live in an immutable `MLPWeights`; a retrain builds a new one and swaps the
reference in a single assignment, so a concurrent predict sees either the old or the new
model, never a half-loaded one.
"""
from __future__ import annotations

import copy
import threading
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from services.predictor.config import MLPConfig
from services.predictor.learning import TrainingStopped

# Version of the saved weights' layout and input features. 2: an ensemble whose input is the
# embedder's vector (head+tail embedding when tail_chars > 0). Files without it were trained
# on another input and are refused, not mis-read.
FORMAT = 2


def build_module(dim: int, hidden: int, dropout: float = 0.0) -> nn.Module:
    # One hidden layer: a deeper head on a few thousand frozen embeddings only overfits.
    return nn.Sequential(nn.Dropout(dropout), nn.Linear(dim, hidden), nn.GELU(),
                         nn.Dropout(dropout), nn.Linear(hidden, 1))


class Ensemble(nn.Module):
    """Members trained with different seeds; the output is their mean log length."""

    def __init__(self, members: list[nn.Module]):
        super().__init__()
        self.members = nn.ModuleList(members)

    @property
    def input_dim(self) -> int:
        return int(self.members[0][1].in_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.stack([m(x) for m in self.members]).mean(0)


@dataclass(frozen=True)
class MLPWeights:
    module: nn.Module
    version: int
    num_records: int
    # The seed data's shift (log) its seed targets were moved by, and the seed records' share
    # of its training weight: the part of its output a later shift estimate still moves.
    seed_shift: float = 0.0
    seed_share: float = 1.0

    def predict_log(self, vectors: np.ndarray) -> np.ndarray:
        """log1p(length) per vector. Lengths are heavy-tailed; the model regresses log1p,
        which treats a 2× error alike for short and long replies."""
        dim = getattr(self.module, "input_dim", None)
        if dim is not None and vectors.shape[-1] != dim:
            raise ValueError(f"MLP takes {dim}-d inputs, got {vectors.shape[-1]}-d vectors")
        with torch.inference_mode():
            out = self.module(torch.from_numpy(np.ascontiguousarray(vectors, np.float32)))
        return out.squeeze(-1).numpy().astype(np.float64)

    def predict(self, vectors: np.ndarray) -> np.ndarray:
        return np.expm1(self.predict_log(vectors)).clip(min=1.0)


def train(vectors: np.ndarray, lengths: np.ndarray, config: MLPConfig,
          weights: np.ndarray | None = None, stop: threading.Event | None = None) -> Ensemble:
    """`weights`: a record's weight in the loss (default all equal); the served model's own
    completions weigh more than seed records. `stop`: checked every epoch; once set, raises
    ``TrainingStopped``."""
    if len(vectors) < config.min_train_records:
        raise ValueError(f"need at least {config.min_train_records} records to train the MLP, "
                         f"got {len(vectors)}")
    return Ensemble([_train_one(vectors, lengths, config, config.seed + i, weights, stop)
                     for i in range(max(1, config.ensemble))]).eval()


def _train_one(vectors: np.ndarray, lengths: np.ndarray, config: MLPConfig, seed: int,
               weights: np.ndarray | None = None, stop: threading.Event | None = None
               ) -> nn.Module:
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    x = torch.from_numpy(np.asarray(vectors, np.float32))
    y = torch.log1p(torch.from_numpy(np.asarray(lengths, np.float32)))
    w = None if weights is None else torch.from_numpy(np.asarray(weights, np.float64))
    fit, val = _holdout(len(x), config, gen)
    module = build_module(x.shape[1], config.hidden, config.dropout)
    with torch.no_grad():  # start at the median so the first epochs learn shape, not offset
        module[-1].bias.fill_(_median(y[fit], None if w is None else w[fit]))
    opt = torch.optim.AdamW(module.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    best, best_state, stale = float("inf"), None, 0
    for _ in range(config.epochs):
        if stop is not None and stop.is_set():
            raise TrainingStopped("MLP training stopped")
        module.train()
        for idx in _epoch(fit, w, gen).split(config.batch_size):
            loss = _pinball(module(x[idx]).squeeze(-1), y[idx], config.quantile)
            opt.zero_grad()
            loss.backward()
            opt.step()
        if val is None:
            continue
        module.eval()
        with torch.no_grad():
            score = float(_pinball(module(x[val]).squeeze(-1), y[val], config.quantile,
                                   None if w is None else w[val]))
        if score < best - 1e-4:
            best, best_state, stale = score, copy.deepcopy(module.state_dict()), 0
        elif (stale := stale + 1) >= config.patience:
            break
    if best_state is not None:
        module.load_state_dict(best_state)
    return module.eval()


def _holdout(n: int, config: MLPConfig, gen: torch.Generator):
    """(fit, validation) indices; no validation (train all epochs) when it would be too small
    to tell overfitting from noise."""
    order = torch.randperm(n, generator=gen)
    n_val = int(n * config.val_fraction)
    if n_val < config.min_val_records:
        return order, None
    return order[n_val:], order[:n_val]


def _median(y: torch.Tensor, weights: torch.Tensor | None) -> float:
    if weights is None:
        return float(y.median())
    order = torch.argsort(y)
    cum = torch.cumsum(weights[order], 0)
    return float(y[order][int(torch.searchsorted(cum, cum[-1] / 2))])


def _epoch(fit: torch.Tensor, weights: torch.Tensor | None,
           gen: torch.Generator) -> torch.Tensor:
    """One epoch's order of training records. Weighted records are drawn in proportion to
    their weight: every batch then mixes seed and observed records as the weights say, where
    weighting the loss would leave most batches without a single observed record."""
    if weights is None:
        return fit[torch.randperm(len(fit), generator=gen)]
    draw = torch.multinomial(weights[fit], len(fit), replacement=True, generator=gen)
    return fit[draw]


def _pinball(pred: torch.Tensor, target: torch.Tensor, q: float,
             weights: torch.Tensor | None = None) -> torch.Tensor:
    # On log length, q=0.5 (L1) fits the conditional median: relative errors are judged
    # per request, and a squared loss would chase the long-reply tail.
    err = target - pred
    loss = torch.maximum(q * err, (q - 1.0) * err)
    if weights is None:
        return loss.mean()
    return (loss * weights.to(loss.dtype)).sum() / weights.sum().to(loss.dtype)


def save(module: Ensemble, path: str, num_records: int, encoder: str | None = None) -> None:
    """`encoder`: the id of the encoder whose vectors the MLP was trained on (embedder.py)."""
    # npz of plain arrays: a worker's output is loaded without unpickling anything.
    arrays = {k: v.detach().numpy() for k, v in module.state_dict().items()}
    tag = {} if encoder is None else {"__encoder__": np.array(encoder)}
    np.savez(path, __num_records__=np.array(num_records), __format__=np.array(FORMAT),
             **tag, **arrays)


def load(path: str, input_dim: int | None = None,
         encoder: str | None = None) -> tuple[Ensemble, int]:
    """Weights saved by `save`; refuses files of another format, input width or encoder."""
    with np.load(path) as data:
        meta = {"__num_records__", "__format__", "__encoder__"}
        fmt = int(data["__format__"]) if "__format__" in data.files else 1
        if fmt != FORMAT:
            raise ValueError(f"{path}: MLP weights of format {fmt}, this predictor reads "
                             f"format {FORMAT} (other input features); retrain the MLP")
        built = str(data["__encoder__"]) if "__encoder__" in data.files else None
        if encoder is not None and built is not None and built != encoder:
            raise ValueError(f"{path}: MLP trained on vectors of encoder {built!r}, the embedder "
                             f"is {encoder!r}; retrain the MLP")
        state = {k: torch.from_numpy(data[k]) for k in data.files if k not in meta}
        num_records = int(data["__num_records__"])
    n = len({k.split(".")[1] for k in state})
    hidden, dim = state["members.0.1.weight"].shape
    if input_dim is not None and dim != input_dim:
        raise ValueError(f"{path}: MLP takes {dim}-d inputs, the embedder gives {input_dim}-d "
                         f"vectors; retrain the MLP")
    module = Ensemble([build_module(dim, hidden) for _ in range(n)])
    module.load_state_dict(state)
    return module.eval(), num_records


class MLPSlot:
    """The served MLP of each model, swapped atomically with a version counter."""

    def __init__(self):
        self._weights: dict[str, MLPWeights] = {}
        self._lock = threading.Lock()

    def get(self, model: str) -> MLPWeights | None:
        return self._weights.get(model)

    def version(self, model: str) -> int:
        w = self._weights.get(model)
        return 0 if w is None else w.version

    def swap(self, model: str, module: nn.Module, num_records: int, seed_shift: float = 0.0,
             seed_share: float = 1.0) -> int:
        with self._lock:
            version = self.version(model) + 1
            new = dict(self._weights)
            new[model] = MLPWeights(module.eval(), version, num_records, seed_shift, seed_share)
            self._weights = new
            return version
