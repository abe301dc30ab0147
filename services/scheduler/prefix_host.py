"""The host tier of the prefix cache: cached blocks the device evicted, kept in host memory.

A full block of computed KV is immutable, so its bytes may be copied to the host at any time
and its key (``prefix_cache``'s chained key) names them there as well as on the device. The
tier reuses the KV manager's swap path, one *owner* per block (``HOST_OWNER`` plus a
counter, never a request id): ``swap_out`` writes a block back, ``swap_in`` uploads it (the
manager frees the host copy once it has landed) and ``free`` evicts it. No second copy path.

* **Write-back ahead of eviction.** A block is evicted when an allocation needs it and an
  iteration writes into it right after, too late to copy it out. So at the end of every step
  the free cached blocks next in the device's eviction order (within ``window`` blocks of it,
  just-freed ones included) start copying out; the copies run beside the next iteration and
  are waited for after it. If the next schedule evicts such a block, its write-back is
  abandoned (the copy may read the block as the iteration overwrites it: its host copy is
  freed unread), so eviction never waits; only a block whose host copy an upload has already
  taken must land first. When the device evicts a
  written-back block its key lives on here (same prefix id: the chain past it stays
  reachable). A block evicted before any write-back is dropped, as without the tier.
* **Bounded LRU, never blocking.** At most ``capacity`` blocks; a write-back into a full tier
  first evicts the least recently used entry, and a swap-out of a request that finds the host
  pool short evicts entries too (a swapped request's KV takes precedence over a cache). An
  entry written back this iteration is never evicted in the same one (its copy has not run).
* **Uploads when the policy picks the request, pinned until it runs.** A request with part of
  its prefix here is queued at once (ranked by its cached tokens on both tiers). When its
  policy picks it for admission (``prefix_start``), its host blocks are uploaded into free
  device blocks, indexed at once and pinned to it with the prefix's device part
  (``prefix_pins``: no eviction takes them, no admission is kept out by them). Admitted in
  the same iteration, it waits for its own copies before the iteration runs; not admitted
  (no room yet), the copies run beside the iteration and it finds the blocks on the device
  when picked again. Uploads at arrival were lost behind a queue: the blocks sat free and
  other admissions evicted them first.
* **Sharing with swapped requests.** A swapped request's host copy and a cached block are
  different owners in the host pool: neither is ever freed for the other (one pool, separate
  blocks).
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from services.scheduler.prefix_pins import PIN_ITERATIONS

HOST_OWNER = "\x1fprefix/"     # request ids may not start with \x1f (checked on arrival)


@dataclass(slots=True)
class HostEntry:
    owner: str          # the KV manager's owner of the host copy
    uid: int            # the prefix id the key had on the device
    fresh: bool = True  # written back this iteration: its copy has not run yet


class HostPrefixTier:
    def __init__(self, capacity: int, window: int):
        if capacity < 1:
            raise ValueError(f"a host prefix tier needs >= 1 block, got {capacity}")
        self.capacity, self.window = capacity, window
        # key -> entry, least recently used first.
        self.entries: OrderedDict[tuple, HostEntry] = OrderedDict()
        self._next = 0
        self._fresh: list[HostEntry] = []       # written back, copies not yet run
        # device block -> (owner, key) of its write-back in flight; owners of evicted ones
        # to wait for before the block is overwritten, or whose copy is abandoned.
        self.writing: dict[int, tuple[str, tuple]] = {}
        self.must_wait: set[str] = set()
        self.abandoned: list[str] = []
        self.num_written = self.num_uploaded = self.num_evicted = self.num_abandoned = 0

    def __len__(self) -> int:
        return len(self.entries)

    def get(self, key: tuple) -> HostEntry | None:
        return self.entries.get(key)

    def add(self, key: tuple, uid: int) -> HostEntry:
        self._next += 1
        entry = self.entries[key] = HostEntry(f"{HOST_OWNER}{self._next}", uid)
        self._fresh.append(entry)
        self.num_written += 1
        return entry

    def take(self, key: tuple) -> HostEntry:
        """Remove an entry being uploaded (the manager frees its copy once it has landed)."""
        self.num_uploaded += 1
        entry = self.entries.pop(key)
        entry.fresh = False         # out of the count of fresh entries still here
        return entry

    def evict_lru(self) -> HostEntry | None:
        """The least recently used entry whose copy has run, removed; None if there is none
        (fresh entries are the most recent: this stops at the first one)."""
        for key, entry in self.entries.items():
            if entry.fresh:
                return None
            del self.entries[key]
            self.num_evicted += 1
            return entry
        return None

    def num_evictable(self) -> int:
        return len(self.entries) - sum(1 for e in self._fresh if e.fresh)

    def evicting(self, block: int) -> None:
        """The device evicts ``block``: abandon its write-back if one is in flight."""
        writing = self.writing.pop(block, None)
        if writing is None:
            return
        owner, key = writing
        entry = self.entries.get(key)
        if entry is not None and entry.owner == owner:
            del self.entries[key]
            entry.fresh = False
            self.abandoned.append(owner)
            self.num_abandoned += 1
        else:                       # an upload took its host copy: the copy must land first
            self.must_wait.add(owner)

    def settle(self) -> int:
        """The write-backs in flight have run (abandoned ones freed): how many host blocks
        the abandoned ones held."""
        self.writing.clear()
        self.must_wait.clear()
        for entry in self._fresh:
            entry.fresh = False
        self._fresh.clear()
        n = len(self.abandoned)
        self.abandoned.clear()
        return n

    def drop_owner(self, owner: str) -> bool:
        """Forget the entry of ``owner`` (its write-back failed); whether there was one."""
        for key, entry in self.entries.items():
            if entry.owner == owner:
                del self.entries[key]
                entry.fresh = False
                return True
        return False

    def check(self, device_uid_of_key) -> None:
        assert len(self.entries) <= self.capacity, "host prefix tier over capacity"
        owners = [e.owner for e in self.entries.values()]
        assert len(set(owners)) == len(owners), "two host entries share an owner"
        for key, entry in self.entries.items():
            uid = device_uid_of_key(key)
            assert uid is None or uid == entry.uid, f"key on device and host under two ids"


# -- planning, on the scheduler's state (``SchedulerState``) -----------------------------------

def fetch(state, request) -> None:
    """The policy picks a queued request (``prefix_start``): upload the part of its prompt's
    prefix the host holds, pinned to it with the free cached part on the device (the chain's
    head). The copies start after the schedule; the request finds the blocks indexed now."""
    bm, host = state.block_manager, state.prefix_host
    n, pins, rid = len(request.token_ids), bm.pins, request.request_id
    if rid in pins.of:
        state.pinned_at[rid] = state.iteration      # picked again: its pins live on
    if n <= bm.block_size or not host.entries:
        return
    found = bm.prefix.match_tiers(request.token_ids, (n - 1) // bm.block_size)
    if all(block is not None for _, block in found):
        return
    ref = bm._ref
    state.pinned_at[rid] = state.iteration
    room = pins.limit - len(pins)
    for _, block in found:      # the device part first: the uploads may not evict it
        if block is not None and ref[block] == 0 and block in bm.prefix.free_cached and room:
            pins.pin(rid, block)
            room -= 1
    for key, block in found:
        if block is not None:
            continue
        # Into plain free blocks, else the least recently used cached ones (pinned blocks
        # and blocks whose copy is in flight are never taken).
        if room <= 0 or not bm.num_free_uncached_blocks + len(bm.prefix.free_cached):
            return
        entry = host.take(key)
        block = bm.upload_target(rid, key, entry.uid)
        state.prefix_uploads.append((entry.owner, block))
        state.num_pending_host_blocks += 1      # the manager frees it once it has landed
        state.prefix_host_hit_tokens += bm.block_size
        room -= 1


def expire_pins(state) -> None:
    """Drop the pins of requests the policy has not picked for ``PIN_ITERATIONS``."""
    pinned_at, pins = state.pinned_at, state.block_manager.pins
    for rid in [r for r, it in pinned_at.items() if state.iteration - it > PIN_ITERATIONS]:
        del pinned_at[rid]
        pins.release(rid)


def write_back(state, output) -> None:
    """At the end of a step: write back the free cached blocks next in the eviction order."""
    bm, host = state.block_manager, state.prefix_host
    for block in bm.writeback_candidates(host.window):
        if (len(host) >= host.capacity or not state.num_free_host_blocks) and not evict(
                state, 1, output):
            return
        key = bm.prefix.key_of(block)
        entry = host.add(key, bm.prefix.uid_of(block))
        state.num_free_host_blocks -= 1
        output.prefix_writebacks.append((entry.owner, block))
        host.writing[block] = (entry.owner, key)


def evict(state, count: int, output) -> bool:
    """Free ``count`` host blocks by evicting the tier's least recently used entries; False,
    and nothing evicted, if too few may go."""
    host = state.prefix_host
    if host is None or host.num_evictable() < count:
        return False
    for _ in range(count):
        output.prefix_frees.append(host.evict_lru().owner)
        state.num_free_host_blocks += 1
    return True
