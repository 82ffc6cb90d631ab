"""Cached sequences found by longest prefix, least recently used out first, under a cap on their summed size.

Both tiers of the prompt cache use it: the device tier (sequences kept in the KV under spare sequence ids, sized in
KV cells) and the RAM tier (state snapshots, sized in bytes). Lookup walks the prompt's block-hash chain
(``blocks.chain``) back from its deepest block to the first one some entry also holds, then compares tokens: the
exact common prefix may run into the next, partial block.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Callable, Optional

import numpy as np

from . import blocks
from .snapshot import Snapshot


class PrefixLRU:
    def __init__(self, cap: int, seed: bytes, block: int, size: Callable[[Snapshot], int]):
        self.cap = cap
        self.seed = seed
        self.block = block
        self.size = size
        self.entries: "OrderedDict[int, Snapshot]" = OrderedDict()  # least recently used first
        self._hashes: dict[int, list[bytes]] = {}  # key -> its block chain
        self._index: dict[bytes, set[int]] = {}  # block hash -> keys of the entries holding that prefix
        self._next = 0
        self.used = 0  # summed size of the entries
        self.hits = self.misses = self.evictions = 0

    def __len__(self) -> int:
        return len(self.entries)

    def candidates(self, tokens, limit: int) -> list[tuple[int, Snapshot, int]]:
        """Every entry sharing at least one block with tokens[:limit], as (key, entry, length): the longest shared
        prefix first; among equals the shortest entry (one that ends where the prefix ends serves it whole, as a
        sliding-window sequence past its window must: a conversation's later turns share as much with its first
        turn's prompt as that turn's own entry does, and only that one can serve it), then the oldest."""
        probe = blocks.chain(tokens[:limit], self.seed, self.block)
        keys = self._index.get(probe[0], ()) if probe else ()
        found = [(key, self.entries[key], blocks.common_prefix(self.entries[key].tokens, tokens[:limit]))
                 for key in keys]
        return sorted(found, key=lambda c: (-c[2], c[1].n, c[0]))

    def hit(self, key: int) -> None:
        self.entries.move_to_end(key)
        self.hits += 1

    def miss(self) -> None:
        self.misses += 1

    def put(self, snap: Snapshot, protect: Optional[Snapshot] = None) -> tuple[bool, list[Snapshot]]:
        """Insert (replacing an entry with the same tokens), evicting the least recently used past the cap, never
        ``protect``. Returns whether it was kept (not when larger than the cap left to it) and the entries that
        left."""
        chain = blocks.chain(snap.tokens, self.seed, self.block)
        gone = []
        if chain:
            for key in list(self._index.get(chain[-1], ())):
                if np.array_equal(self.entries[key].tokens, snap.tokens):
                    gone.append(self.remove(key))
        size = self.size(snap)
        spared = self.size(protect) if protect is not None and protect in self.entries.values() else 0
        if size > self.cap - spared or not chain:
            return False, gone
        while self.used + size > self.cap:
            gone.append(self.pop_oldest(protect))
        key, self._next = self._next, self._next + 1
        self.entries[key] = snap
        self._hashes[key] = chain
        for h in chain:
            self._index.setdefault(h, set()).add(key)
        self.used += size
        return True, gone

    def pop_oldest(self, protect: Optional[Snapshot] = None) -> Snapshot:
        """Evict the least recently used entry but ``protect``."""
        self.evictions += 1
        return self.remove(next(k for k, e in self.entries.items() if e is not protect))

    def remove(self, key: int) -> Snapshot:
        snap = self.entries.pop(key)
        for h in self._hashes.pop(key):
            keys = self._index[h]
            keys.discard(key)
            if not keys:
                del self._index[h]
        self.used -= self.size(snap)
        return snap
