"""What one cached sequence holds: its tokens, both contexts' states, the slot's feature bookkeeping, checkpoints.

A *resident* sequence (a released slot's) keeps its states in the live contexts: there ``target`` and
``drafter`` are empty. So does a device-tier entry, under a spare sequence id of both contexts (``seq``). A RAM
entry or a slot file carries them as bytes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(eq=False)
class Features:
    """The slot's feature bookkeeping (see engine/slot.py): the drafter KV holds target features for positions
    [drafter_base, drafter_len); ``rows`` are features of [drafter_len, drafter_len + len(rows)) not injected yet;
    ``gap``: positions past those got no features (adaptive drafting had extraction paused)."""

    drafter_base: int = 0
    drafter_len: int = 0
    gap: bool = False
    rows: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), np.float32))  # [m, n_feature_cols]
    positions: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))  # [m]

    @property
    def n_featured(self) -> int:
        """End of the positions with known features."""
        return self.drafter_len + len(self.positions)

    def keeps_context(self, p: int) -> bool:
        """Whether a reuse of the first p positions keeps the drafter's context: its KV holds features of
        [drafter_base, min(drafter_len, p)) and the rows pending carry on from there up to p. Past the features
        (decoded while adaptive drafting had extraction paused), or before drafter_base (the context restarted
        after a pause), the drafter's context restarts at the reuse point (engine/prefix.py ``_trim``)."""
        return self.drafter_base <= p <= self.n_featured

    def context_end(self, p: int) -> int:
        """The longest reuse of at most p positions that keeps the drafter's context (see ``keeps_context``);
        0 where none does."""
        if self.keeps_context(p):
            return p
        return self.n_featured if self.drafter_base <= self.n_featured < p else 0

    @property
    def nbytes(self) -> int:
        return self.rows.nbytes + self.positions.nbytes

    def cut(self, n: int) -> "Features":
        """The bookkeeping of the first n positions, for a drafter KV that keeps only those."""
        if self.drafter_base >= n:  # the drafter's context started at or past n: none of it is kept
            return Features(n, n, True)
        dlen = min(self.drafter_len, n)
        keep = self.positions < n
        rows = self.rows[keep] if len(self.rows) else self.rows
        f = Features(self.drafter_base, dlen, False, rows, self.positions[keep])
        f.gap = f.n_featured < n
        return f


@dataclass
class Checkpoint:
    """The target's sliding-window layers at ``n`` positions (state flag PARTIAL): restoring it and trimming the
    full-attention layers to ``n`` gives the exact state at ``n``, however far the sequence ran past the window."""

    n: int
    swa_min: int  # smallest position the restored SWA layers hold
    target: bytes


@dataclass(eq=False)  # identity: entries hold numpy arrays
class Snapshot:
    tokens: np.ndarray  # [n] int32: the tokens at positions 0..n-1 of both KV caches
    features: Features
    swa_min: int = 0  # smallest position the target's SWA layers hold after a restore (0 without SWA)
    checkpoints: list[Checkpoint] = field(default_factory=list)
    target: bytes = b""  # full target state (empty for a resident: it lives in the context)
    drafter: bytes = b""  # full drafter state ('' also when the engine has no drafter)
    seq: int = -1  # a device-tier entry: the spare sequence id holding both states in the KV (-1: none)
    # its prompt shared a prefix with earlier traffic (the prompt cache's second-sight rule, engine/prefix.py)
    recurs: bool = False
    n_prompt: int = 0  # a resident: how many leading positions were its request's prompt (0: unknown, all)
    talks: bool = False  # a resident whose request reused an earlier answer: a conversation's turn (the grace)

    @property
    def n(self) -> int:
        return len(self.tokens)

    @property
    def nbytes(self) -> int:
        return (len(self.target) + len(self.drafter) + self.tokens.nbytes + self.features.nbytes
                + sum(len(c.target) for c in self.checkpoints))
