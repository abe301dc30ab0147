"""Streamed attention waves (FluidInfer, report §4.1, Fig. 7b-8): requests whose KV lives in
the host tier run in the same forward pass as the resident ones.

The token-wise layers (projections, MLP, norms) run once over every token of the iteration;
only attention needs a request's KV. Per layer, attention runs first over the resident
sequences (device pool), then wave by wave over the streamed ones, whose KV is the host
tier's block store ``[num_layers, 2, num_host_blocks, block_size, Hkv, D]``:

* ``in_place`` (host and device are the same memory: a CPU executor): a streamed wave's
  attention reads the host store's layer directly through the host block table, and the new
  K/V is written straight into it. No copy at all: the host copy is the only copy.
* ``staged`` (a CUDA device, or forced): each wave's layer-l blocks are uploaded into one of
  two device staging buffers (a side stream: the next wave's upload runs while the current one
  computes; events order every read after its copy and every buffer reuse after the compute
  that read it). The new K/V is written into the staging buffer for attention and, after the
  forward pass, only the new K/V rows are written back to the host store (the host copy stays
  the master). On a CPU the same code runs with synchronous copies (the tests use it).

Staging holds one layer of one wave, so its device KV is ``wave_blocks / num_layers`` of the
pool blocks it stands for.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from services.executor.attention.base import AttentionMetadata
from services.executor.interface import StreamError

__all__ = ["StreamError", "StreamPlan", "plan_streams"]


@dataclass
class _Wave:
    meta: AttentionMetadata        # block tables in host block ids (in_place) or staging ids
    rows: torch.Tensor             # query rows (= the wave's fed tokens) in the flat batch
    host_slots: torch.Tensor       # int64 host slots of the wave's fed tokens
    host_blocks: torch.Tensor      # int64 host blocks to upload (staged)
    staged_slots: torch.Tensor     # int64 slots of the fed tokens in the staging buffer


@dataclass
class StreamPlan:
    """One iteration's split of attention into resident and streamed waves."""

    host: torch.Tensor                                  # the host block store
    resident_rows: torch.Tensor                         # fed tokens of resident sequences
    resident_waves: list[tuple[AttentionMetadata, torch.Tensor]]
    waves: list[_Wave]
    staged: bool
    staging: _Staging | None = None
    writebacks: list[tuple[int, torch.Tensor, torch.Tensor, torch.Tensor]] = field(
        default_factory=list)
    bytes_uploaded: int = 0

    def attention(self, layer: int, q, k, v, ctx, scale: float, window: int = 0,
                  softcap: float = 0.0) -> torch.Tensor:
        """Write this iteration's K/V and attend, resident waves then streamed waves
        (``window``, ``softcap``: the layer's sliding window and score cap, 0 for none)."""
        opts = {"window": window, "softcap": softcap} if window or softcap else {}
        out = torch.empty_like(q)
        rows = self.resident_rows
        if self.staged and self.waves:
            self.staging.upload(self, layer, 0)        # beside the resident attention
        if rows.numel():
            ctx.kv_cache.write(layer, k[rows], v[rows], ctx.slot_mapping[rows])
            k_cache, v_cache = ctx.kv_cache.layer(layer)
            for sub, sub_rows in self.resident_waves:
                out[sub_rows] = ctx.backend.forward(q[sub_rows], k_cache, v_cache, sub, scale,
                                                   **opts)
        for i, wave in enumerate(self.waves):
            if self.staged:
                k_cache, v_cache = self.staging.ready(self, layer, i)
                slots = wave.staged_slots
            else:
                k_cache, v_cache = self.host[layer, 0], self.host[layer, 1]
                slots = wave.host_slots
            _write(k_cache, v_cache, k[wave.rows], v[wave.rows], slots)
            out[wave.rows] = ctx.backend.forward(q[wave.rows], k_cache, v_cache, wave.meta,
                                                 scale, **opts)
            if self.staged:
                self.staging.computed(i)
                self.writebacks.append((layer, wave.host_slots, k[wave.rows], v[wave.rows]))
        return out

    def finish(self) -> None:
        """After the forward pass: write only the new K/V of staged waves back to the host."""
        for layer, slots, k, v in self.writebacks:
            _write(self.host[layer, 0], self.host[layer, 1], k.to("cpu"), v.to("cpu"), slots)
        self.writebacks.clear()


def _write(k_cache, v_cache, k, v, slots) -> None:
    heads, dim = k_cache.shape[2], k_cache.shape[3]
    k_cache.view(-1, heads, dim)[slots.to(k_cache.device)] = k.to(k_cache.device, k_cache.dtype)
    v_cache.view(-1, heads, dim)[slots.to(v_cache.device)] = v.to(v_cache.device, v_cache.dtype)


class _Staging:
    """Two device buffers per K and V, each one wave of one layer; uploads on a side stream
    on CUDA (synchronous copies elsewhere)."""

    def __init__(self, host: torch.Tensor, num_blocks: int, device: torch.device):
        shape = (2, num_blocks, *host.shape[3:])
        self.k = torch.empty(shape, dtype=host.dtype, device=device)
        self.v = torch.empty(shape, dtype=host.dtype, device=device)
        self.num_blocks = num_blocks
        self.cuda = device.type == "cuda"
        self.stream = torch.cuda.Stream(device) if self.cuda else None
        self.uploaded: dict[int, object] = {}      # buffer -> event: its upload landed
        self.freed: dict[int, object] = {}         # buffer -> event: its compute is done

    def upload(self, plan: StreamPlan, layer: int, i: int) -> None:
        buf, wave = i % 2, plan.waves[i]
        n = int(wave.host_blocks.numel())
        plan.bytes_uploaded += 2 * n * self.k[0, 0].numel() * self.k.element_size()
        if not self.cuda:
            self.k[buf, :n] = plan.host[layer, 0][wave.host_blocks]
            self.v[buf, :n] = plan.host[layer, 1][wave.host_blocks]
            return
        stream = self.stream
        if buf in self.freed:                       # never overwrite what a wave still reads
            stream.wait_event(self.freed.pop(buf))
        with torch.cuda.stream(stream):
            for dst, src in ((self.k, plan.host[layer, 0]), (self.v, plan.host[layer, 1])):
                dst[buf, :n].copy_(src[wave.host_blocks].pin_memory(), non_blocking=True)
            event = torch.cuda.Event()
            event.record(stream)
        self.uploaded[buf] = event

    def ready(self, plan: StreamPlan, layer: int, i: int):
        """The buffer holding wave ``i`` of ``layer`` (uploaded at the layer's start or
        while wave ``i - 1`` computed), once its copy has landed; starts the next wave's
        upload into the other buffer first, so that it runs while this one computes."""
        if i + 1 < len(plan.waves):
            self.upload(plan, layer, i + 1)
        buf = i % 2
        if self.cuda and buf in self.uploaded:
            torch.cuda.current_stream().wait_event(self.uploaded.pop(buf))
        return self.k[buf], self.v[buf]

    def computed(self, i: int) -> None:
        if self.cuda:
            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream())
            self.freed[i % 2] = event


def plan_streams(host: torch.Tensor, meta: AttentionMetadata, slots: torch.Tensor,
                 streamed: list[bool], waves: list[list[int]] | None, *, staged: bool,
                 staging: _Staging | None, device: torch.device, to_device) -> StreamPlan:
    """Split the batch: resident sequences keep ``waves`` (or one wave), streamed sequences
    run in their waves (or one), each wave's host blocks renumbered into staging when staged."""
    streamed_ids = {i for i, s in enumerate(streamed) if s}
    waves = waves or [[i for i in range(len(streamed)) if i not in streamed_ids],
                      sorted(streamed_ids)]
    for wave in waves:
        if wave and len({i in streamed_ids for i in wave}) > 1:
            raise ValueError(f"attention wave {wave} mixes resident and streamed sequences")
    resident = [w for w in waves if w and w[0] not in streamed_ids]
    res_rows = [meta.select(w) for w in resident]
    rows = torch.cat([r for _, r in res_rows]) if res_rows else torch.empty(0, dtype=torch.long)
    res_rows = [(to_device(m, device), r.to(device)) for m, r in res_rows]
    plan = StreamPlan(host, rows.to(device), res_rows, [], staged)
    block_size = host.shape[3]
    for wave in (w for w in waves if w and w[0] in streamed_ids):
        sub, wave_rows = meta.select(wave)
        host_slots = slots[wave_rows.to(slots.device)].long()
        if not staged:     # the host store is where attention runs (a CPU executor)
            plan.waves.append(_Wave(sub, wave_rows, host_slots, host_slots, host_slots))
            continue
        wave = _staged_wave(sub, wave_rows, host_slots, block_size, staging)
        wave.meta, wave.rows = to_device(wave.meta, device), wave.rows.to(device)
        plan.waves.append(wave)
    plan.staging = staging
    return plan


def _staged_wave(sub: AttentionMetadata, rows, host_slots, block_size: int,
                 staging: _Staging) -> _Wave:
    """Renumber the wave's host blocks 0..n-1 in the staging buffer."""
    lens = sub.seq_lens.tolist()
    tables = [sub.block_tables[j, :-(-n // block_size)].tolist() for j, n in enumerate(lens)]
    blocks = sorted({b for t in tables for b in t})
    if len(blocks) > staging.num_blocks:
        raise StreamError(f"a streamed wave needs {len(blocks)} staging blocks, the staging "
                          f"area has {staging.num_blocks}")
    index = {b: i for i, b in enumerate(blocks)}
    staged = AttentionMetadata.build(sub.query_lens.tolist(), lens,
                                     [[index[b] for b in t] for t in tables],
                                     sub.seq_lens.device)
    block_of = host_slots // block_size
    remap = torch.tensor([index[int(b)] for b in block_of], dtype=torch.long)
    staged_slots = remap * block_size + host_slots % block_size
    return _Wave(staged, rows, host_slots, torch.tensor(blocks, dtype=torch.long), staged_slots)
