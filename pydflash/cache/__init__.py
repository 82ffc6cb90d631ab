"""The prompt cache: per-slot prefix reuse, a RAM cache across slots, SWA checkpoints and slot files.

Every path snapshots or trims the target and the drafter together (docs/architecture.md, failure classes: restoring
the target's KV without the drafter's injected features is the classic speculative prompt-cache bug).

- ``config``    CacheConfig (what to reuse, the RAM cap, checkpoint spacing)
- ``blocks``    the hash chain over token blocks that keys the RAM cache
- ``snapshot``  what one cached sequence holds: tokens, both states, the feature bookkeeping, checkpoints
- ``ram``       the RAM cache: byte cap, LRU eviction, longest-prefix lookup, counters
- ``slotfile``  the on-disk slot format (llama-server's /slots save|restore)
- ``digest``    model digests mixed into keys and files, so another model pair never matches

The engine side (which slot, trim or restore, checkpoints) lives in ``pydflash/engine/prefix.py``.
"""

from .config import CacheConfig
from .ram import RamCache
from .snapshot import Checkpoint, Features, Snapshot

__all__ = ["CacheConfig", "RamCache", "Snapshot", "Features", "Checkpoint"]
