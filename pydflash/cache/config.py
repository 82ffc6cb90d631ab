"""Prompt-cache options (llama-server: --cache-reuse, --cache-ram, --ctx-checkpoints)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CacheConfig:
    # A released slot keeps its tokens and both KV caches; a new request goes to the free slot sharing the
    # longest prefix and prefills only the rest.
    reuse: bool = True
    # RAM cache across slots (MiB of snapshots, both contexts); 0 turns it off.
    ram_mib: float = 256.0
    # SWA targets: a target checkpoint of the sliding-window layers every this many positions (0: none). Without
    # one, a sequence past the window cannot be trimmed back (the window no longer holds what a shorter prefix
    # needs) and the request re-prefills.
    checkpoint_every: int = 256
    max_checkpoints: int = 8  # per sequence; the oldest goes first
    # A resident sequence about to lose at least this many positions to a new request is copied to RAM first.
    save_min_drop: int = 64
    block: int = 32  # tokens per hash block (RAM lookups find prefixes of at least one block)

    def __post_init__(self):
        if self.ram_mib < 0:
            raise ValueError("ram_mib must be >= 0")
        if self.checkpoint_every < 0 or self.max_checkpoints < 0 or self.save_min_drop < 0:
            raise ValueError("checkpoint_every, max_checkpoints and save_min_drop must be >= 0")
        if self.block < 1:
            raise ValueError("block must be >= 1")

    @property
    def ram_bytes(self) -> int:
        return int(self.ram_mib * 1024 * 1024)
