"""The in-process executor: one batched iteration over a flat ragged batch per ``execute``.

An iteration is validated completely before anything touches the KV pool, so a bad request is
refused with ``InvalidRequestError`` and the pool keeps every other request's data.
"""
from __future__ import annotations

import threading
import time
from itertools import chain

import numpy as np
import torch

from lenserve_contract.sampling_params import InvalidRequestError
from services.executor.attention.base import AttentionMetadata
from services.executor.attention.registry import check_backend_name, get_backend
from services.executor.block_tables import BlockTables
from services.executor.decode_graphs import DecodeGraphs
from services.executor.interface import Executor
from services.executor.kv_cache import KVCachePool
from services.executor.models.layers import AttentionContext
from services.executor.models.loader import LoadedModel, load_model
from services.executor.sampler import Sampler, SampleRequest
from services.executor.sampling_state import SamplingState
from services.executor.streaming import StreamError, _Staging, plan_streams
from services.executor.types import (
    ExecutorInput,
    ExecutorOutput,
    IterationTimings,
    ModelInfo,
    ScheduledSequence,
)

CPU_KV_CACHE_BYTES = 1 << 30
GPU_MEMORY_UTILIZATION = 0.9


class InProcessExecutor(Executor):
    compiles_grammars = True

    def __init__(self, model: str | LoadedModel, *, block_size: int = 16,
                 num_gpu_blocks: int | None = None, kv_cache_memory_bytes: int | None = None,
                 attention_backend: str = "auto", dtype: str = "auto", device: str = "cpu",
                 max_model_len: int | None = None, seed: int = 0,
                 skip_tokenizer_init: bool = False, cuda_graphs: bool = True,
                 max_graph_batch: int = 256):
        """``cuda_graphs``: replay decode iterations of up to ``max_graph_batch`` sequences
        from captured CUDA graphs (on a CUDA device with a graph-safe attention backend);
        False runs every iteration eagerly, as vLLM's ``enforce_eager``."""
        check_backend_name(attention_backend)   # before loading weights
        self.loaded = (model if isinstance(model, LoadedModel)
                       else load_model(model, dtype=dtype, device=device, seed=seed,
                                       skip_tokenizer_init=skip_tokenizer_init))
        self.tokenizer = self.loaded.tokenizer
        self.net = self.loaded.model
        self.device = next(self.net.parameters()).device
        self.backend = get_backend(attention_backend, str(self.device))
        self.max_model_len = self._context_limit(max_model_len)
        self.block_size = block_size
        num_blocks = num_gpu_blocks or self._blocks_for(kv_cache_memory_bytes)
        net = self.net
        graphs = cuda_graphs and self.device.type == "cuda" and self.backend.graph_safe
        self.kv = KVCachePool(net.num_layers, num_blocks, block_size, net.num_kv_heads,
                              net.head_dim, self.loaded.dtype, str(self.device), scratch=graphs)
        self.graphs = (DecodeGraphs(net, self.kv, self.backend, self.max_model_len,
                                    max_graph_batch) if graphs else None)
        # ``seed`` makes the random weights of a preset; sampling without a request seed
        # takes fresh entropy (a fixed stream would repeat the same text after each restart).
        self.sampler = Sampler()
        self.sampling_state = SamplingState(self.device, self._grammars)
        self._grammar_cache = None
        self._grammar_lock = threading.Lock()   # made once, by an iteration or a compile
        self._history_ids: set[str] = set()     # requests whose sampling reads their history
        self.block_tables = BlockTables()
        self.swap_buffers: dict[str, torch.Tensor] = {}   # name -> host buffer, per slot
        self._replayed = False    # the last forward was a graph replay (greedy rows are ready)
        self._verified: dict[str, object] = {}
        self.stream_host: torch.Tensor | None = None   # the host tier's blocks (streaming)
        self.stream_staged = self.device.type != "cpu"
        self._staging: _Staging | None = None
        self.stream_bytes = 0       # bytes uploaded into staging so far (staged streaming)

    def attach_stream_source(self, host: torch.Tensor, *, staged: bool | None = None,
                             staging_blocks: int = 0) -> None:
        """Let sequences with a ``host_block_table`` run with their KV in ``host``
        (``[num_layers, 2, num_host_blocks, block_size, Hkv, D]``, the KV manager's store).
        ``staged``: copy each wave's layer into a device staging area (default on a GPU; a
        CPU executor reads the host blocks in place); ``staging_blocks``: its size in blocks
        of one layer (0: the device pool's block count)."""
        kv = self.kv
        want = (kv.num_layers, 2, kv.block_size, kv.num_kv_heads, kv.head_dim)
        got = (host.shape[0], host.shape[1], *host.shape[3:])
        if host.dim() != 6 or got != want or host.dtype != kv.cache.dtype:
            raise InvalidRequestError(f"stream source {tuple(host.shape)} {host.dtype} does "
                                      f"not match the KV pool's layout {want} {kv.cache.dtype}",
                                      field="stream_source")
        self.stream_host = host
        self.stream_staged = self.stream_staged if staged is None else staged
        self._staging = (_Staging(host, staging_blocks or kv.num_blocks, self.device)
                         if self.stream_staged else None)

    def _context_limit(self, requested: int | None) -> int:
        limit = self.loaded.max_model_len
        if requested is not None and requested > limit:
            raise InvalidRequestError(
                f"max_model_len {requested} exceeds the model's {limit} positions",
                field="max_model_len")
        return requested or limit

    def _blocks_for(self, memory_bytes: int | None) -> int:
        if memory_bytes is None:
            memory_bytes = CPU_KV_CACHE_BYTES
            if self.device.type == "cuda":
                free, total = torch.cuda.mem_get_info(self.device)
                # Weights are already resident, so "used" includes them.
                memory_bytes = int(GPU_MEMORY_UTILIZATION * total) - (total - free)
        net = self.net
        per_block = KVCachePool.bytes_per_block(net.num_layers, self.block_size, net.num_kv_heads,
                                                net.head_dim, self.loaded.dtype)
        if memory_bytes < per_block:
            raise InvalidRequestError(
                f"KV cache memory {memory_bytes} bytes is less than one block ({per_block} bytes)",
                field="kv_cache_memory_bytes")
        return memory_bytes // per_block

    def model_info(self) -> ModelInfo:
        net, loaded = self.net, self.loaded
        return ModelInfo(
            name=loaded.name, family=loaded.family, vocab_size=net.vocab_size,
            num_layers=net.num_layers, num_heads=net.num_heads, num_kv_heads=net.num_kv_heads,
            head_dim=net.head_dim, max_model_len=self.max_model_len, block_size=self.block_size,
            num_gpu_blocks=self.kv.num_blocks, bytes_per_block=self.kv.block_bytes,
            eos_token_id=loaded.eos_token_id, dtype=str(loaded.dtype).removeprefix("torch."),
            attention_backend=self.backend.name, eos_token_ids=loaded.eos_token_ids)

    def execute(self, batch: ExecutorInput) -> ExecutorOutput:
        start = time.perf_counter()
        logits, ctx, forward_s, swap_s = self.forward_logits(batch)
        sample_start = time.perf_counter()
        sampling = [s for s in batch.sequences if s.sample]
        top: dict[str, list[tuple[int, float]]] = {}
        if self._replayed and all(s.sampling_params.greedy and s.sampling_params.plain
                                  for s in sampling):
            tokens, logprobs = self.graphs.greedy(len(sampling))   # replayed from a graph
        elif sampling:
            tokens, logprobs, top = self._sample(logits, sampling)
        else:
            tokens, logprobs = [], []
        end = time.perf_counter()
        ids = [s.request_id for s in sampling]
        timings = IterationTimings(
            forward_s=forward_s, attention_s=ctx.attention_s if ctx else 0.0,
            sample_s=end - sample_start, total_s=end - start, swap_s=swap_s,
            wave_attention_s=list(ctx.wave_attention_s) if ctx else [])
        return ExecutorOutput(batch.iteration, dict(zip(ids, tokens)), dict(zip(ids, logprobs)),
                              timings, top)

    def _sample(self, logits: torch.Tensor, sampling: list[ScheduledSequence]):
        reqs = [SampleRequest(s.sampling_params, s.num_output_tokens) for s in sampling]
        state = self.sampling_state
        penalties = mask = None
        if len(state):
            penalties, mask = state.prepare(sampling)
        with torch.inference_mode():    # the logits are inference tensors, changed in place
            out = self.sampler.sample(logits, reqs, penalties, mask)
        if len(state):
            state.advance(sampling, out)
        top = {sampling[row].request_id: pairs for row, pairs in out.top.items()}
        return out.tokens, out.logprobs, top

    def compile_grammar(self, structured_output) -> None:
        self._grammars().compile(structured_output)

    def _grammars(self):
        """The grammar cache, made when the first request with structured output comes."""
        with self._grammar_lock:
            if self._grammar_cache is None:
                from services.executor.structured import GrammarCache
                loaded = self.loaded            # a finished value may end on any EOS id
                eos = list(loaded.eos_token_ids) or (
                    [] if loaded.eos_token_id is None else [loaded.eos_token_id])
                self._grammar_cache = GrammarCache(self.tokenizer, self.net.vocab_size, eos)
            return self._grammar_cache

    def forward_logits(self, batch: ExecutorInput
                       ) -> tuple[torch.Tensor, AttentionContext | None, float, float]:
        """Validate, move blocks, run the model; logits of the sampling sequences, the
        attention context, forward seconds and swap seconds."""
        seqs = batch.sequences
        self._replayed = False
        tables = self.block_tables.resolve(batch)
        self._validate(batch, tables)
        self.block_tables.commit(batch, tables)
        self._remember_verified(batch)
        if self._history_ids:     # a batch of plain requests skips this per-sequence loop
            self.sampling_state.forget(batch.finished_request_ids)
            self._history_ids.difference_update(batch.finished_request_ids)
            self.sampling_state.observe(seqs)
        swap_s = self._swap(batch)
        self.kv.copy_blocks(batch.copy_blocks)
        if not seqs:
            return torch.empty(0, self.net.vocab_size), None, 0.0, swap_s
        streamed = [s.host_block_table is not None for s in seqs]
        if self.graphs is not None and not any(streamed) and self.graphs.accepts(batch, tables):
            start = time.perf_counter()
            logits = self.graphs.run(seqs, tables)
            torch.cuda.synchronize(self.device)
            self._replayed = True
            return logits, None, time.perf_counter() - start, swap_s
        input_ids, positions, slots, meta, sample_rows = _prepare(seqs, tables, self.block_size,
                                                                  streamed)
        dev = self.device
        plan = self._plan_streams(meta, slots, streamed, batch.waves) if any(streamed) else None
        ctx = AttentionContext(_meta_on(meta, dev), slots.to(dev), self.kv, self.backend,
                               None if plan else batch.waves, time_attention=dev.type == "cpu",
                               stream=plan)
        start = time.perf_counter()
        try:
            with torch.inference_mode():
                hidden = self.net(input_ids.to(dev), positions.to(dev), ctx)
                logits = self.net.compute_logits(hidden[sample_rows.to(dev)])
                if plan is not None:
                    plan.finish()
                    self.stream_bytes += plan.bytes_uploaded
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
        except (RuntimeError, MemoryError) as exc:
            if plan is None or isinstance(exc, StreamError):
                raise
            raise StreamError(f"a streamed iteration failed: {exc}") from exc
        return logits, ctx, time.perf_counter() - start, swap_s

    def _plan_streams(self, meta, slots, streamed, waves):
        return plan_streams(self.stream_host, meta, slots, streamed, waves,
                            staged=self.stream_staged, staging=self._staging,
                            device=self.device, to_device=_meta_on)

    def attach_swap_buffer(self, name: str, buffer: torch.Tensor) -> None:
        """Register a host buffer ``[slots, num_layers, 2, block_size, Hkv, D]`` that
        ``swap_out``/``swap_in`` moves of an ExecutorInput naming it copy through."""
        self.swap_buffers[name] = buffer

    def _swap(self, batch: ExecutorInput) -> float:
        if not (batch.swap_out or batch.swap_in):
            return 0.0
        start = time.perf_counter()
        buf = self.swap_buffers.get(batch.swap_buffer)
        if buf is None:
            raise InvalidRequestError(f"unknown swap buffer {batch.swap_buffer!r}",
                                      field="swap_shm_name")
        if batch.swap_out:
            dev, slots = zip(*batch.swap_out)
            buf[list(slots)] = self.kv.export_blocks(list(dev)).permute(2, 0, 1, 3, 4, 5).to(buf)
        if batch.swap_in:
            slots, dev = zip(*batch.swap_in)
            self.kv.import_blocks(list(dev), buf[list(slots)].permute(1, 2, 0, 3, 4, 5))
        return time.perf_counter() - start

    def _validate(self, batch: ExecutorInput, tables: list[list[int]]) -> None:
        seen: set[str] = set()
        vocab, limit, bs = self.net.vocab_size, self.max_model_len, self.block_size
        for seq, table in zip(batch.sequences, tables):
            if seq.request_id in seen:
                raise InvalidRequestError(f"request {seq.request_id!r} appears twice in one "
                                          "iteration", field="request_id")
            seen.add(seq.request_id)
            toks, end = seq.token_ids, seq.num_computed_tokens + len(seq.token_ids)
            # The cheap test runs every iteration; the detailed one only to name what is wrong.
            if not (toks and seq.num_computed_tokens >= 0 and end <= limit
                    and len(table) * bs >= end and min(toks) >= 0 and max(toks) < vocab):
                self._validate_sequence(seq, table)
            if self._verified.get(seq.request_id) is not seq.sampling_params:
                self._verify_params(seq.request_id, seq.sampling_params)
        # Ids sent in this batch only: a delta's earlier blocks were checked when they came.
        sent = np.fromiter(chain.from_iterable(s.block_table for s in batch.sequences), np.int64)
        if sent.size and (sent.min() < 0 or sent.max() >= self.kv.num_blocks):
            for table in tables:
                self.kv.check_block_ids(table, "block_table")
        self._validate_streamed(batch, tables)
        self.kv.check_block_ids([b for pair in batch.copy_blocks for b in pair], "copy_blocks")
        moved = [d for d, _ in batch.swap_out] + [d for _, d in batch.swap_in]
        self.kv.check_block_ids(moved, "swap")

    def _verify_params(self, request_id: str, params) -> None:
        params.verify()
        if not params.plain:
            params.check_vocab(self.net.vocab_size)
            if params.structured_output is not None:
                self._grammars()    # refuses here, before the KV pool is touched
            if params.needs_history:
                self._history_ids.add(request_id)

    def _validate_streamed(self, batch: ExecutorInput, tables: list[list[int]]) -> None:
        for seq, table in zip(batch.sequences, tables):
            if seq.host_block_table is None:
                continue
            if self.stream_host is None:
                raise InvalidRequestError(f"request {seq.request_id!r} is streamed from the "
                                          "host tier but this executor has no stream source",
                                          field="host_block_table")
            num = self.stream_host.shape[2]
            if not all(0 <= b < num for b in table) or len(set(table)) != len(table):
                raise InvalidRequestError(f"request {seq.request_id!r} has host block ids "
                                          f"outside 0..{num - 1} or repeated",
                                          field="host_block_table")

    def _remember_verified(self, batch: ExecutorInput) -> None:
        """Sampling parameters objects already verified, by request: the scheduler sends the
        same object every iteration, so each is verified once while it runs."""
        for rid in batch.finished_request_ids:
            self._verified.pop(rid, None)
        for seq in batch.sequences:
            self._verified[seq.request_id] = seq.sampling_params

    def _validate_sequence(self, seq: ScheduledSequence, table: list[int]) -> None:
        rid = seq.request_id
        if not seq.token_ids or seq.num_computed_tokens < 0:
            raise InvalidRequestError(f"request {rid!r} feeds no tokens or has a negative "
                                      "num_computed_tokens", field="token_ids")
        if seq.context_len > self.max_model_len:
            raise InvalidRequestError(
                f"request {rid!r} reaches position {seq.context_len - 1}, past max_model_len "
                f"{self.max_model_len}", field="max_model_len")
        need = -(-seq.context_len // self.block_size)
        if len(table) < need:
            raise InvalidRequestError(f"request {rid!r} needs {need} KV blocks for "
                                      f"{seq.context_len} tokens, its block table has "
                                      f"{len(table)}", field="block_table")
        if seq.host_block_table is None:
            self.kv.check_block_ids(table, "block_table")
        if min(seq.token_ids) < 0 or max(seq.token_ids) >= self.net.vocab_size:
            raise InvalidRequestError(f"request {rid!r} has token ids outside the vocabulary "
                                      f"0..{self.net.vocab_size - 1}", field="token_ids")
        seq.sampling_params.verify()

    def export_blocks(self, block_ids: list[int], out: torch.Tensor | None = None
                      ) -> torch.Tensor:
        return self.kv.export_blocks(block_ids, out)

    def import_blocks(self, block_ids: list[int], data: torch.Tensor) -> None:
        self.kv.import_blocks(block_ids, data)

    def export_blocks_int8(self, block_ids: list[int], num_tokens: int | None = None,
                           out: torch.Tensor | None = None) -> torch.Tensor:
        return self.kv.export_blocks_int8(block_ids, num_tokens, out)

    def import_blocks_int8(self, block_ids: list[int], data: torch.Tensor) -> None:
        self.kv.import_blocks_int8(block_ids, data)


def _meta_on(meta: AttentionMetadata, device: torch.device) -> AttentionMetadata:
    if meta.seq_lens.device == device:
        return meta
    return AttentionMetadata(meta.query_start_loc.to(device), meta.seq_lens.to(device),
                             meta.block_tables.to(device), meta.max_query_len, meta.max_seq_len)


def _prepare(seqs: list[ScheduledSequence], tables: list[list[int]], block_size: int,
             streamed: list[bool] | None = None):
    """Flat ``input_ids, positions, slot_mapping``, attention metadata and the rows whose
    logits are needed (the last fed token of each sampling sequence), built on the host.
    A streamed sequence's slots are host slots (its table holds host blocks)."""
    q_lens = [s.num_tokens for s in seqs]
    meta = AttentionMetadata.build(q_lens, [s.context_len for s in seqs],
                                   tables)
    input_ids = torch.tensor([t for s in seqs for t in s.token_ids], dtype=torch.long)
    positions = torch.cat([torch.arange(s.num_computed_tokens, s.context_len) for s in seqs])
    owner = torch.repeat_interleave(torch.arange(len(seqs)), torch.tensor(q_lens))
    blocks = meta.block_tables[owner, positions // block_size].long()
    slots = blocks * block_size + positions % block_size
    keys = slots
    if streamed and any(streamed):      # host and device slots are separate spaces
        keys = slots * 2 + torch.tensor(streamed, dtype=torch.long)[owner]
    if torch.unique(keys).numel() != keys.numel():
        raise InvalidRequestError("two fed tokens of this iteration map to the same KV slot "
                                  "(overlapping block tables)", field="block_table")
    ends = meta.query_start_loc[1:].long() - 1
    sample_rows = ends[torch.tensor([s.sample for s in seqs], dtype=torch.bool)]
    return input_ids, positions, slots, meta, sample_rows
