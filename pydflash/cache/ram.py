"""The RAM prompt cache: snapshots of both contexts, found by longest cached prefix, under a byte cap (LRU).

Lookup walks the prompt's block-hash chain (``blocks.chain``) back from its deepest block to the first one some
entry also holds, then compares tokens: the exact common prefix may run into the next, partial block.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Optional

import numpy as np

from . import blocks
from .snapshot import Snapshot


class RamCache:
    def __init__(self, cap_bytes: int, seed: bytes, block: int = 32):
        self.cap = cap_bytes
        self.seed = seed
        self.block = block
        self.entries: "OrderedDict[int, Snapshot]" = OrderedDict()  # least recently used first
        self._hashes: dict[int, list[bytes]] = {}  # key -> its block chain
        self._index: dict[bytes, set[int]] = {}  # block hash -> keys of the entries holding that prefix
        self._next = 0
        self.bytes = 0
        self.hits = self.misses = self.evictions = 0

    def __len__(self) -> int:
        return len(self.entries)

    def lookup(self, tokens, limit: int) -> Optional[tuple[int, Snapshot, int]]:
        """The entry sharing the longest prefix (at least one block) with tokens[:limit]: (key, entry, length)."""
        probe = blocks.chain(tokens[:limit], self.seed, self.block)
        for depth in range(len(probe) - 1, -1, -1):
            keys = self._index.get(probe[depth])
            if not keys:
                continue
            best = None
            for key in keys:
                snap = self.entries[key]
                n = blocks.common_prefix(snap.tokens, tokens[:limit])
                if best is None or n > best[2]:
                    best = (key, snap, n)
            return best
        return None

    def hit(self, key: int) -> None:
        self.entries.move_to_end(key)
        self.hits += 1

    def miss(self) -> None:
        self.misses += 1

    def put(self, snap: Snapshot) -> bool:
        """Insert (replacing an entry with the same tokens), evicting the least recently used past the cap.
        An entry larger than the whole cap is not kept."""
        chain = blocks.chain(snap.tokens, self.seed, self.block)
        if chain:
            for key in list(self._index.get(chain[-1], ())):
                if np.array_equal(self.entries[key].tokens, snap.tokens):
                    self.remove(key)
        if snap.nbytes > self.cap or not chain:
            return False
        while self.bytes + snap.nbytes > self.cap:
            self.remove(next(iter(self.entries)))
            self.evictions += 1
        key, self._next = self._next, self._next + 1
        self.entries[key] = snap
        self._hashes[key] = chain
        for h in chain:
            self._index.setdefault(h, set()).add(key)
        self.bytes += snap.nbytes
        return True

    def remove(self, key: int) -> None:
        snap = self.entries.pop(key)
        for h in self._hashes.pop(key):
            keys = self._index[h]
            keys.discard(key)
            if not keys:
                del self._index[h]
        self.bytes -= snap.nbytes

    def metrics(self) -> dict:
        return {"entries": len(self.entries), "bytes": self.bytes, "cap_bytes": self.cap, "hits": self.hits,
                "misses": self.misses, "evictions": self.evictions}
