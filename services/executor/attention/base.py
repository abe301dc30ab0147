"""The attention backend interface and the metadata every backend reads.

Layout conventions (shared by all backends and by the KV pool):

* queries of an iteration are one flat ragged tensor ``q[num_tokens, num_heads, head_dim]``;
  sequence ``i`` owns rows ``query_start_loc[i]:query_start_loc[i+1]``;
* each layer's cache is ``k_cache, v_cache: [num_blocks, block_size, num_kv_heads, head_dim]``;
* ``seq_lens[i]`` is sequence ``i``'s context length *including* this iteration's tokens, which
  the runner has already written into the cache; query row ``j`` of sequence ``i`` sits at
  position ``seq_lens[i] - q_len_i + j`` and attends causally to keys ``0..that position``;
* ``block_tables[i, b]`` is the device block holding positions ``b*block_size ...``;
  unused entries are padding and must not be read.

Two per-layer options refine the causal mask and the scores (every backend honours both):
``window`` > 0 is a sliding window (Mistral, Gemma, Phi-3): a query at position ``p`` sees keys
``p - window + 1 .. p`` only, as Hugging Face's ``sliding_window`` mask; ``softcap`` > 0 squashes
each scaled score ``s`` to ``softcap * tanh(s / softcap)`` before the softmax (Gemma 2).

``AttentionMetadata.select`` gives the metadata of any subset of the sequences, so attention
can run in waves (FluidInfer) over a few sequences at a time.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch


@dataclass
class AttentionMetadata:
    query_start_loc: torch.Tensor   # int32 [num_seqs + 1]
    seq_lens: torch.Tensor          # int32 [num_seqs]
    block_tables: torch.Tensor      # int32 [num_seqs, max_blocks_per_seq]
    max_query_len: int
    max_seq_len: int
    # Split-KV factor for decode when the caller fixes it (a CUDA graph of padded rows must
    # split as the unpadded batch would); None lets the backend choose.
    num_splits: int | None = None

    @property
    def num_seqs(self) -> int:
        return int(self.seq_lens.shape[0])

    @property
    def query_lens(self) -> torch.Tensor:
        return self.query_start_loc[1:] - self.query_start_loc[:-1]

    @classmethod
    def build(cls, query_lens: list[int], seq_lens: list[int], block_tables: list[list[int]],
              device: torch.device | str = "cpu") -> AttentionMetadata:
        width = max((len(t) for t in block_tables), default=0) or 1
        table = torch.zeros((len(block_tables), width), dtype=torch.int32)
        for i, t in enumerate(block_tables):
            table[i, : len(t)] = torch.tensor(t, dtype=torch.int32)
        starts = [0]
        for n in query_lens:
            starts.append(starts[-1] + n)
        return cls(
            query_start_loc=torch.tensor(starts, dtype=torch.int32, device=device),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
            block_tables=table.to(device),
            max_query_len=max(query_lens, default=0),
            max_seq_len=max(seq_lens, default=0),
        )

    def select(self, seq_ids: list[int]) -> tuple[AttentionMetadata, torch.Tensor]:
        """Metadata for a subset of sequences, plus the query row indices they own."""
        qsl = self.query_start_loc.tolist()
        rows = [torch.arange(qsl[i], qsl[i + 1]) for i in seq_ids]
        lens = [qsl[i + 1] - qsl[i] for i in seq_ids]
        sub = AttentionMetadata.build(
            lens, self.seq_lens[seq_ids].tolist(),
            [self.block_tables[i].tolist() for i in seq_ids], self.seq_lens.device,
        )
        idx = torch.cat(rows) if rows else torch.empty(0, dtype=torch.long)
        return sub, idx.to(self.seq_lens.device)


class AttentionBackend(ABC):
    name: str = "abstract"
    # True when ``forward`` never synchronises with the host, so a CUDA graph can capture it.
    graph_safe: bool = False

    def decode_splits(self, num_seqs: int, num_kv_heads: int, max_seq_len: int,
                      device: torch.device) -> int:
        """The split-KV factor ``forward`` would use for such a decode batch (1: none)."""
        return 1

    @abstractmethod
    def forward(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                meta: AttentionMetadata, scale: float, window: int = 0,
                softcap: float = 0.0) -> torch.Tensor:
        """Return ``out[num_tokens, num_heads, head_dim]`` for the ragged queries ``q``
        (``window``, ``softcap``: 0 for none, see the module docstring).

        ``num_heads`` is a multiple of ``num_kv_heads`` (grouped-query attention: query head
        ``h`` reads KV head ``h // (num_heads // num_kv_heads)``)."""
