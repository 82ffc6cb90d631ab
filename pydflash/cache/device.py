"""The device tier of the prompt cache: sequences kept in the KV itself, under spare sequence ids.

In a unified KV cache (one stream for every sequence) ``seq_cp`` only marks cells as belonging to one more
sequence: keeping a released slot's sequence, or restoring it into another slot, moves no K/V byte and never
touches the device. The RAM tier copies a sequence's state out instead, thousands of small device-to-host copies
on a GPU, which stalled every slot between steps.

The price is KV cells. An entry holds its cells until it is evicted, and in a unified cache every token's attention
mask spans every cell in use, so entries are kept under a cap (``cap`` cells, least recently used out first) and the
engine reserves each running request's worst case before it admits one (``PromptCache.make_room``). Sizes count
every cell of an entry, also those it shares with a slot: an upper bound, which keeps the reservation safe.

Both contexts move together: an entry is the target's and the drafter's cells of the same positions, with the
slot's feature bookkeeping (``Snapshot.features``), so a restore never leaves one without the other.
"""

from __future__ import annotations

from typing import Callable, Optional

from .lru import PrefixLRU
from .snapshot import Snapshot


class DeviceCache(PrefixLRU):
    def __init__(self, contexts: list, spare_ids: range, cap_cells: int, seed: bytes, block: int,
                 on_evict: Callable[[Snapshot], None] = lambda entry: None):
        super().__init__(cap_cells, seed, block, size=lambda snap: snap.n)
        self.contexts = contexts  # the target's, then the drafter's if any: every copy and removal spans both
        self.free = list(reversed(spare_ids))  # popped from the end: the lowest id first
        self.n_ids = len(spare_ids)
        self.on_evict = on_evict  # sees an evicted entry while its cells are still there (the RAM tier copies it)
        self.kept = 0  # entries ever kept: each one a seq_cp, no copy (a counter for tests and /metrics)
        self.kept_at: dict[int, int] = {}  # entry key -> the admission count when it was kept
        self.hit_keys: set[int] = set()  # entries hit at least once
        self.expired = 0  # entries that left unhit after their probation (see ``expire``)

    def keep(self, src: int, snap: Snapshot, protect: Optional[Snapshot] = None,
             admissions: int = 0) -> Optional[Snapshot]:
        """Give the first ``snap.n`` positions of live sequence ``src`` a spare id of their own (both contexts),
        evicting the least recently used entries (never ``protect``, the entry about to be restored) for the id
        and the cells. None if not kept (over the cap, or no id to free). ``admissions``: the engine's count so
        far, the start of the entry's probation."""
        if snap.n > self.cap or snap.n == 0:
            return None
        if not self.free:
            if not any(e is not protect for e in self.entries.values()):
                return None
            self.evict_oldest(protect)
        entry = Snapshot(snap.tokens, snap.features, swa_min=snap.swa_min, seq=self.free.pop(), recurs=snap.recurs)
        kept, gone = self.put(entry, protect)
        for old in gone:
            self._drop(old)
        if not kept:  # no full block of tokens: nothing a lookup could find
            self.free.append(entry.seq)
            return None
        for ctx in self.contexts:
            ctx.seq_rm(entry.seq, 0)  # empty already; a failure half way must not leak old cells into this entry
            ctx.seq_cp(src, entry.seq, 0, snap.n)
        self.kept += 1
        self.kept_at[next(reversed(self.entries))] = admissions
        return entry

    def hit(self, key: int) -> None:
        super().hit(key)
        self.hit_keys.add(key)

    def touch(self, key: int) -> None:
        """An entry that a prompt holds whole, served from it or not (a conversation's first turn, inside each of
        its later turns; a system prompt inside every turn): used, as a shared prefix's blocks are by every
        request that holds them in a paged KV. It passes its probation and is the most recently used. Before, a
        first turn's entry was never hit while its conversation went on from its own slot, and left after its
        probation (as many admissions as slots): at 4-8 clients of the chat workload every conversation's first
        turn was prefilled again each round (an H100, 2026-12-06: 67-73 % of prompt tokens reused)."""
        self.entries.move_to_end(key)
        self.hit_keys.add(key)

    def remove(self, key: int) -> Snapshot:
        self.kept_at.pop(key, None)
        self.hit_keys.discard(key)
        return super().remove(key)

    def expire(self, admissions: int, probation: int) -> None:
        """Entries never hit within ``probation`` admissions of being kept leave: traffic that does not come back
        to them only pays for their cells."""
        for key in [k for k, at in self.kept_at.items() if k not in self.hit_keys and admissions - at > probation]:
            self._drop(self.remove(key))
            self.expired += 1
            self.evictions += 1  # a kind of eviction (/metrics counts them together)

    def evict(self, key: int) -> None:
        """Give up one entry (the prompt cache picks those whose cells no slot shares: ``PromptCache._kept_cells``)."""
        self.evictions += 1
        self._drop(self.remove(key))

    def restore(self, entry: Snapshot, dst: int) -> None:
        """Sequence ``dst`` (emptied first) shares all of the entry's cells, in both contexts."""
        for ctx in self.contexts:
            ctx.seq_rm(dst, 0)
            ctx.seq_cp(entry.seq, dst)

    def evict_oldest(self, protect: Optional[Snapshot] = None) -> None:
        self._drop(self.pop_oldest(protect))

    def _drop(self, entry: Snapshot) -> None:
        """An entry that left: the RAM tier may copy it first, then its cells go back to the KV (those shared with
        a live sequence stay with it) and its id to the pool."""
        try:
            self.on_evict(entry)
        finally:
            for ctx in self.contexts:
                ctx.seq_rm(entry.seq, 0)
            self.free.append(entry.seq)

    def metrics(self) -> dict:
        return {"entries": len(self.entries), "cells": self.used, "cap_cells": self.cap, "ids": self.n_ids,
                "kept": self.kept, "hits": self.hits, "misses": self.misses, "evictions": self.evictions,
                "expired": self.expired}
