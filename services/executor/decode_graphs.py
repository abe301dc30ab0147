"""CUDA graphs for decode iterations.

A decode step of a small model is a few hundred short kernels; launched one by one from
Python, the launches, not the GPU, set the step time. A graph captured once per batch-size
bucket replays the whole forward (embedding to logits) as one launch. Everything the step reads
lives in static device buffers filled by two host-to-device copies from pinned memory; the
forward does no host synchronisation, so it can be captured as is.

A batch of ``n`` sequences runs in the smallest bucket ``b >= n``; the ``b - n`` padding rows
decode token 0 at position 0 of the KV pool's scratch block (which belongs to no request), and
their logits are dropped. Graphs are captured lazily, the first time a bucket is needed, and
share one memory pool (they are never replayed concurrently, and each one's logits are sampled
before the next replay).
"""
from __future__ import annotations

import numpy as np
import torch

from services.executor.attention.base import AttentionBackend, AttentionMetadata
from services.executor.kv_cache import KVCachePool
from services.executor.models.layers import AttentionContext
from services.executor.types import ExecutorInput, ScheduledSequence

BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256, 320, 384, 448, 512)


def buckets_up_to(max_batch: int) -> list[int]:
    chosen = [b for b in BUCKETS if b < max_batch]
    return chosen + [max_batch]


class DecodeGraphs:
    def __init__(self, net: torch.nn.Module, kv: KVCachePool, backend: AttentionBackend,
                 max_model_len: int, max_batch: int = 256):
        if kv.scratch_block is None:
            raise ValueError("decode graphs need a KV pool with a scratch block")
        self.net, self.kv, self.backend = net, kv, backend
        self.block_size = kv.block_size
        self.max_model_len = max_model_len
        self.buckets = buckets_up_to(max_batch)
        self.max_batch = self.buckets[-1]
        self.width = -(-max_model_len // self.block_size)
        dev = kv.cache.device
        mb, width = self.max_batch, self.width
        # int64: token ids, positions, KV slots; int32: seq_lens, then the block tables.
        self.i64 = torch.zeros(3 * mb, dtype=torch.long, device=dev)
        self.i32 = torch.zeros(mb + mb * width, dtype=torch.int32, device=dev)
        self.h64 = torch.zeros(3 * mb, dtype=torch.long).pin_memory()
        self.h32 = torch.zeros(mb + mb * width, dtype=torch.int32).pin_memory()
        self.n64, self.n32 = self.h64.numpy(), self.h32.numpy()
        self.query_start_loc = torch.arange(mb + 1, dtype=torch.int32, device=dev)
        # Which request's table each host row holds, and how many blocks of it.
        self.row_owner: list[str | None] = [None] * mb
        self.row_len = [0] * mb
        # Keyed by (bucket, split-KV factor): the padded batch splits as the unpadded one.
        self.graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        self.logits: dict[tuple[int, int], torch.Tensor] = {}
        self.greedy_out: dict[tuple[int, int], torch.Tensor] = {}   # [2, bucket] float64
        self.last_key: tuple[int, int] | None = None
        self.pool = None

    def accepts(self, batch: ExecutorInput, tables: list[list[int]]) -> bool:
        """Pure decode (one fed token per sequence, each sampled), one attention wave, and
        shapes the static buffers hold."""
        seqs = batch.sequences
        if not seqs or len(seqs) > self.max_batch:
            return False
        if batch.waves is not None and sum(1 for w in batch.waves if w) > 1:
            return False
        return (all(s.num_tokens == 1 and s.sample for s in seqs)
                and max(len(t) for t in tables) <= self.width)

    def run(self, seqs: list[ScheduledSequence], tables: list[list[int]]) -> torch.Tensor:
        """Logits ``[len(seqs), vocab]`` of one decode iteration."""
        n = len(seqs)
        bucket = next(b for b in self.buckets if b >= n)
        max_seq_len = self._stage(seqs, tables, bucket)
        splits = self.backend.decode_splits(n, self.kv.num_kv_heads, max_seq_len,
                                            self.kv.cache.device)
        key = (bucket, splits)
        graph = self.graphs.get(key)
        if graph is None:
            graph = self._capture(key)
        graph.replay()
        self.last_key = key
        return self.logits[key][:n]

    def greedy(self, n: int) -> tuple[list[int], list[float]]:
        """Greedy tokens and their log-probabilities of the last replay's first ``n`` rows,
        computed inside the graph: one device-to-host copy, no sampling kernels."""
        both = self.greedy_out[self.last_key][:, :n].cpu().tolist()
        return [int(t) for t in both[0]], both[1]

    def _stage(self, seqs: list[ScheduledSequence], tables: list[list[int]], bucket: int) -> int:
        """Fill the pinned host buffers, start their copies; the batch's longest context."""
        n, mb, bs, width = len(seqs), self.max_batch, self.block_size, self.width
        pos_list = [s.num_computed_tokens for s in seqs]
        pos = np.array(pos_list, np.int64)
        ids, positions, slots = self.n64[:mb], self.n64[mb:2 * mb], self.n64[2 * mb:]
        ids[:n] = [s.token_ids[0] for s in seqs]
        positions[:n] = pos
        slots[:n] = [t[p // bs] * bs + p % bs for t, p in zip(tables, pos_list)]
        seq_lens, table = self.n32[:mb], self.n32[mb:].reshape(mb, width)
        seq_lens[:n] = pos + 1
        self._stage_tables(seqs, tables, table)
        # Padding rows: token 0 at position 0 of the scratch block.
        scratch = self.kv.scratch_block
        ids[n:bucket] = 0
        positions[n:bucket] = 0
        slots[n:bucket] = scratch * bs
        seq_lens[n:bucket] = 1
        table[n:bucket, 0] = scratch
        self.row_owner[n:bucket] = [None] * (bucket - n)
        self.i64.copy_(self.h64, non_blocking=True)
        used = mb + bucket * width
        self.i32[:used].copy_(self.h32[:used], non_blocking=True)
        return int(pos.max()) + 1

    def _stage_tables(self, seqs: list[ScheduledSequence], tables: list[list[int]],
                      table: np.ndarray) -> None:
        """Rewrite a row only where it changed: a row still holding the same request's table,
        as long as before this batch's delta, gets just the appended blocks (usually none)."""
        owner, length = self.row_owner, self.row_len
        for i, (seq, full) in enumerate(zip(seqs, tables)):
            delta = seq.block_table
            if (seq.block_table_is_delta and owner[i] == seq.request_id
                    and length[i] == len(full) - len(delta)):
                if delta:
                    table[i, length[i]:len(full)] = delta
            else:
                table[i, :len(full)] = full
                owner[i] = seq.request_id
            length[i] = len(full)

    def _context(self, bucket: int, splits: int) -> AttentionContext:
        mb = self.max_batch
        tables = self.i32[mb:].view(mb, self.width)[:bucket]
        # The kernels read every length from the device; the host values only size launches.
        meta = AttentionMetadata(self.query_start_loc[:bucket + 1], self.i32[:bucket], tables,
                                 max_query_len=1, max_seq_len=self.max_model_len,
                                 num_splits=splits)
        return AttentionContext(meta, self.i64[2 * mb:2 * mb + bucket], self.kv, self.backend)

    def _forward(self, key: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
        mb, (bucket, splits) = self.max_batch, key
        ctx = self._context(bucket, splits)
        hidden = self.net(self.i64[:bucket], self.i64[mb:mb + bucket], ctx)
        logits = self.net.compute_logits(hidden)
        # The sampler's greedy rule (argmax, raw log-probability in float32), precomputed.
        scores = logits.float()
        tokens = scores.argmax(dim=-1)
        logprobs = torch.log_softmax(scores, dim=-1).gather(1, tokens[:, None])[:, 0]
        return logits, torch.stack([tokens.double(), logprobs.double()])

    def _capture(self, key: tuple[int, int]) -> torch.cuda.CUDAGraph:
        # The staged batch is real: the warm-up writes the same KV the replay writes again.
        stream = torch.cuda.Stream(device=self.kv.cache.device)
        stream.wait_stream(torch.cuda.current_stream())
        with torch.inference_mode(), torch.cuda.stream(stream):
            for _ in range(2):   # compiles the Triton kernels, fills lazy tables
                self._forward(key)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        with torch.inference_mode(), torch.cuda.graph(graph, pool=self.pool):
            self.logits[key], self.greedy_out[key] = self._forward(key)
        self.graphs[key] = graph
        return graph
