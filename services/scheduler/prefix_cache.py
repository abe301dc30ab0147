"""The index of cached KV blocks behind automatic prefix caching.

A full block of computed tokens is named by a chained key, ``(parent, tokens)``: ``tokens``
are the block's own token ids and ``parent`` the *prefix id* of everything before it (the
root of a chain is the cache's namespace: model, dtype, adapter). Each distinct key gets a
fresh integer prefix id when first indexed, never reused, so a prefix id names one exact
token sequence. Lookups are exact: the index is a dict, which hashes a key and then compares
it in full, so a hash collision can never serve another prefix's KV (what vLLM gets from a
wide cryptographic hash, and SGLang from a radix tree of token ids, this gets from keys that
contain the tokens). A child whose parent was evicted keeps a parent id no later lookup can
produce: it is unreachable and leaves with the LRU like any free block.

Blocks no request holds but whose KV is still indexed wait in an LRU (``free_cached``),
least recently freed first; they count as free and are evicted (key dropped) only when a
block is needed and no uncached free block is left.

With a host tier (``prefix_host``), an evicted key may live on in host memory under the same
prefix id: ``match_tiers`` follows a chain through both tiers, and indexing a key the host
holds reuses its id, so the chain past it stays one chain.
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

Key = tuple


class PrefixIndex:
    def __init__(self, block_size: int, namespace: tuple = ()):
        self.block_size = block_size
        self.root = ("prefix-root", *namespace)
        self._block_of: dict[Key, int] = {}     # key -> the block holding that KV
        self._key_of: dict[int, Key] = {}       # block -> its key
        self._uid_of: dict[int, int] = {}       # block -> the prefix id its key received
        self._next_uid = 0
        # Free blocks whose KV is still indexed, least recently freed first.
        self.free_cached: OrderedDict[int, None] = OrderedDict()
        self.num_evicted = 0
        self.host = None        # a prefix_host.HostPrefixTier, when there is a host tier

    def __len__(self) -> int:
        return len(self._block_of)

    def is_cached(self, block: int) -> bool:
        return block in self._key_of

    def match(self, token_ids: Sequence[int], max_blocks: int) -> tuple[list[int], object]:
        """The indexed blocks holding the longest cached prefix of ``token_ids`` (at most
        ``max_blocks``), and the prefix id the chain ends at (the root for none)."""
        bs, blocks, parent, get = self.block_size, [], self.root, self._block_of.get
        for i in range(max_blocks):
            block = get((parent, tuple(token_ids[i * bs:(i + 1) * bs])))
            if block is None:
                break
            blocks.append(block)
            parent = self._uid_of[block]
        return blocks, parent

    def match_tiers(self, token_ids: Sequence[int], max_blocks: int) -> list[tuple]:
        """The longest cached prefix of ``token_ids`` over device and host: one ``(key,
        device block or None)`` per block, None where only the host tier holds it."""
        bs, found, parent, get = self.block_size, [], self.root, self._block_of.get
        host = self.host.entries if self.host is not None else {}
        for i in range(max_blocks):
            key = (parent, tuple(token_ids[i * bs:(i + 1) * bs]))
            block = get(key)
            if block is not None:
                parent = self._uid_of[block]
            elif key in host:
                parent = host[key].uid
            else:
                break
            found.append((key, block))
        return found

    def key_of(self, block: int) -> Key:
        return self._key_of[block]

    def uid_of_key(self, key: Key) -> int | None:
        block = self._block_of.get(key)
        return None if block is None else self._uid_of[block]

    def insert(self, block: int, parent: object, tokens: tuple) -> int:
        """Index ``block`` as holding ``tokens`` after prefix ``parent``; returns the prefix
        id of that content. If another block already holds it, that one stays indexed and
        ``block`` stays plain (requests that computed the same prefix side by side)."""
        key = (parent, tokens)
        held = self._block_of.get(key)
        if held is not None:
            return self._uid_of[held]
        entry = self.host.get(key) if self.host is not None else None
        if entry is not None:
            return self.index(block, key, entry.uid)     # the host holds it: same prefix id
        self._next_uid += 1
        return self.index(block, key, self._next_uid)

    def index(self, block: int, key: Key, uid: int) -> int:
        """Index ``block`` under ``key`` with prefix id ``uid`` (an upload from the host)."""
        if block in self._key_of:
            raise AssertionError(f"block {block} is indexed twice")
        self._block_of[key], self._key_of[block] = block, key
        self._uid_of[block] = uid
        return uid

    def uid_of(self, block: int) -> int:
        return self._uid_of[block]

    def drop(self, block: int) -> None:
        """Forget the block's KV (evicted, or about to be overwritten)."""
        key = self._key_of.pop(block, None)
        if key is not None:
            del self._block_of[key]
            del self._uid_of[block]
            self.free_cached.pop(block, None)

    def evict_lru(self) -> int:
        """The least recently freed cached block, its KV forgotten."""
        block, _ = self.free_cached.popitem(last=False)
        if self.host is not None:
            self.host.evicting(block)       # a write-back still reading it must land first
        self.drop(block)
        self.num_evicted += 1
        return block

    def clear(self) -> list[int]:
        """Forget every cached KV (the device's KV was lost); returns the blocks that were
        free and cached, now plain free blocks."""
        freed = list(self.free_cached)
        self._block_of.clear()
        self._key_of.clear()
        self._uid_of.clear()
        self.free_cached.clear()
        return freed

    def check(self, refs: list[int]) -> None:
        assert len(self._block_of) == len(self._key_of) == len(self._uid_of), "index sizes differ"
        for key, block in self._block_of.items():
            assert self._key_of.get(block) == key, f"block {block} indexed under two keys"
        for block in self.free_cached:
            assert block in self._key_of, f"free cached block {block} has no key"
            assert refs[block] == 0, f"free cached block {block} has {refs[block]} holders"
        if self.host is not None:
            self.host.check(self.uid_of_key)
