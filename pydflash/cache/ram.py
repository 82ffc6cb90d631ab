"""The RAM tier of the prompt cache: snapshots of both contexts (state bytes copied out of the KV), under a byte
cap. Copying a sequence's state out of a GPU's KV is thousands of small device-to-host copies (one per run of
cells, per layer), so this tier is opt-in: the device tier (``device.py``) keeps sequences at no copy."""

from __future__ import annotations

from .lru import PrefixLRU


class RamCache(PrefixLRU):
    def __init__(self, cap_bytes: int, seed: bytes, block: int = 32):
        super().__init__(cap_bytes, seed, block, size=lambda snap: snap.nbytes)

    @property
    def bytes(self) -> int:
        return self.used

    def metrics(self) -> dict:
        return {"entries": len(self.entries), "bytes": self.used, "cap_bytes": self.cap, "hits": self.hits,
                "misses": self.misses, "evictions": self.evictions}
