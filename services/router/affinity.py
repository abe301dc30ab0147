"""Prefix affinity: which replicas most likely still hold a prompt's leading blocks in their
prefix cache, so that a policy can count the prefill a replica will skip.

The router keeps the map itself, as llm-d's approximate prefix-cache scorer does: it hashes
the prompt's leading *full* blocks, chained as the replicas' ``PrefixIndex`` keys them (a
block's key covers every token before it), and remembers, per block key, the replicas it
placed a prompt with that block on. Chosen over replicas reporting a cache summary on the
load stream (Dynamo's KV events) because it needs no change to the contract or the
replicas, costs nothing on the stats stream, and is exact about what *this* router placed the
instant it placed it, where a report is up to a load interval stale, which is just when the
next turn of a conversation arrives. What it cannot see, a replica's LRU evicting a block, it
bounds: the map holds at most ``capacity`` block keys, least recently placed dropped first
(the default: a few times the blocks of eight A100-80GB pools of Llama-2-7B KV), and forgets
every key of a replica that is lost (its cache went with it). A stale entry costs one placement
that expected a hit it did not get, never a wrong output (the replica matches exactly).

A prompt given as text (no token ids: the replica tokenizes it) is cut into blocks of
``block_size * chars_per_token`` characters: the same text prefix gives the same keys, which is
what a conversation's next turn carries."""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence

DEFAULT_BLOCK_SIZE = 16
DEFAULT_CAPACITY = 1 << 16


class PrefixMap:
    def __init__(self, block_size: int = DEFAULT_BLOCK_SIZE, capacity: int = DEFAULT_CAPACITY,
                 chars_per_token: int = 4):
        if capacity < 1 or block_size < 1:
            raise ValueError(f"block_size and capacity must be >= 1, got {block_size}, "
                             f"{capacity}")
        self.block_size, self.capacity, self.chars_per_token = \
            block_size, capacity, chars_per_token
        self._where: OrderedDict[int, dict[str, None]] = OrderedDict()   # key -> replicas

    def __len__(self) -> int:
        return len(self._where)

    def set_block_size(self, block_size: int) -> None:
        """The replicas' block size (from their load reports); a change clears the map."""
        if block_size > 0 and block_size != self.block_size:
            self.block_size = block_size
            self._where.clear()

    def keys(self, token_ids: Sequence[int] = (), text: str = "") -> tuple[int, ...]:
        """Chained keys of the leading full blocks of a prompt (its token ids, else its text)."""
        unit = self.block_size if token_ids else self.block_size * self.chars_per_token
        seq = token_ids if token_ids else text
        keys, parent = [], 0
        for i in range(len(seq) // unit):
            parent = hash((parent, tuple(seq[i * unit:(i + 1) * unit])))
            keys.append(parent)
        return tuple(keys)

    def cached_blocks(self, keys: Sequence[int], replicas: Iterable[str]) -> dict[str, int]:
        """Per replica, how many leading blocks of ``keys`` it was last given (0: none)."""
        out = {name: 0 for name in replicas}
        alive = set(out)
        for depth, key in enumerate(keys):
            holders = self._where.get(key)
            alive = alive.intersection(holders) if holders else set()
            if not alive:
                break
            for name in alive:
                out[name] = depth + 1
        return out

    def record(self, keys: Sequence[int], replica: str) -> None:
        """``replica`` was given a prompt with these blocks: it will hold them."""
        for key in keys:
            holders = self._where.get(key)
            if holders is None:
                holders = self._where[key] = {}
            else:
                self._where.move_to_end(key)
            holders[replica] = None
        while len(self._where) > self.capacity:
            self._where.popitem(last=False)

    def forget(self, replica: str) -> None:
        """``replica`` lost its cache (it failed or left)."""
        for key in list(self._where):
            holders = self._where[key]
            holders.pop(replica, None)
            if not holders:
                del self._where[key]
