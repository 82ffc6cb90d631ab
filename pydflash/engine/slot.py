"""Per-request state while it occupies a slot (one KV sequence id in both contexts)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from ..errors import InvariantError
from ..native.features import LayerRows
from .adaptive import SlotPolicy
from .copies import SlotCopies
from .controlled import HostSampler
from .lookup import Edge, History
from .proposal import Proposal
from .request import Request
from .stats import Stats
from .text import TextStream


@dataclass
class FeatureRows:
    """Target features of committed positions, tagged with those positions so misalignment is detectable."""

    # [n, n_feature_layers * n_embd_target] float32: our copy, or rows still in the target's buffers (the step
    # that verified them; the drafter's batch is filled from them directly, or ``settle`` copies them out)
    rows: np.ndarray | LayerRows
    positions: np.ndarray  # [n] int32

    @property
    def width(self) -> int:
        return self.rows.width if isinstance(self.rows, LayerRows) else self.rows.shape[1]

    def copy_into(self, out: np.ndarray) -> None:
        if isinstance(self.rows, LayerRows):
            self.rows.copy_into(out)
        else:
            out[:] = self.rows

    def array(self) -> np.ndarray:
        return self.rows.array() if isinstance(self.rows, LayerRows) else self.rows

    def settle(self) -> None:
        self.rows = self.array()


@dataclass
class Slot:
    seq: int
    request: Request
    prompt: list[int]
    draft_max: int
    stats: Stats
    text: TextStream
    n_past: int = 0  # positions in the target KV: every committed token but the anchor
    anchor: int = -1  # last committed token, not yet through the target
    prefill: list[int] = field(default_factory=list)  # prompt tokens (but the anchor) not yet through the target
    admitted: int = 0  # admission order
    drafter_len: int = 0  # end of the positions whose features are in the drafter KV
    drafter_base: int = 0  # first of them: 0, or where features resumed after a gap (see ``restart_features``)
    # features known, not yet injected (the ``pending`` property; its end position is kept beside it)
    _pending: list[FeatureRows] = field(default_factory=list, repr=False)
    _pending_end: int = -1  # end position of the last non-empty pending part, -1: none
    _pending_in_place: bool = False  # some pending rows are still in the target's buffers (``settle_pending``)
    # Some committed positions past the rows got no features (decoded while extraction was off): the rows end
    # before n_past until features resume, and then the drafter's context restarts there.
    feature_gap: bool = False
    keeps_features: bool = True  # whether this step's target features are its to keep (adaptive.Plan.keep)
    generated: list[int] = field(default_factory=list)
    finish_reason: Optional[str] = None
    policy: SlotPolicy = field(default_factory=SlotPolicy)  # adaptive drafting state
    proposal: Optional[Proposal] = None  # rejection sampling's proposal choice (a sampling request with a drafter)
    host: Optional[HostSampler] = None  # drafts and picks drawn on the host (penalties, a grammar: controlled.py)
    history: Optional[History] = None  # prompt + committed tokens, for copied chains (lookup.py); None: no lookup
    copy_edge: Edge = field(default_factory=Edge)  # whether its copies have been earning more than its blocks
    copies: SlotCopies = field(default_factory=SlotCopies)  # what its copies without a block earn (copies.py)
    # (drafter ctx writes, drafter_base, drafter_len) when the drafter KV last matched the bookkeeping (Engine._check)
    drafter_checked: tuple = ()

    @property
    def draft_room(self) -> int:
        """Drafts worth verifying this step: draft_max, less what max_tokens lets out. A step commits at most
        drafts + 1 tokens, and drafts past max_tokens would be verified only to be cut (llama-server caps its drafts
        the same way); capped, every accepted draft is emitted unless EOS or a stop string ends the text. The
        drafter's block keeps its length (``Engine._trim_to_max_tokens``); copies are made this long."""
        return max(0, min(self.draft_max, self.request.max_tokens - len(self.generated) - 1))

    @property
    def prefilled(self) -> bool:
        """The whole prompt but the anchor is in the target KV: the slot drafts and verifies."""
        return not self.prefill

    @property
    def pending(self) -> list[FeatureRows]:
        return self._pending

    @pending.setter
    def pending(self, parts: list[FeatureRows]) -> None:
        self._pending = parts
        self._pending_in_place = any(isinstance(p.rows, LayerRows) for p in parts)
        self._pending_end = next((int(p.positions[-1]) + 1 for p in reversed(parts) if len(p.positions)), -1)

    @property
    def n_pending(self) -> int:
        # pending rows are contiguous from drafter_len (add_features checks each part's start), so the last part's
        # end gives the count; it is kept as an int because this runs for every slot, several times, in every step
        return self._pending_end - self.drafter_len if self._pending_end >= 0 else 0

    @property
    def n_featured(self) -> int:
        """End of the positions with known features (injected or pending)."""
        return self.drafter_len + self.n_pending

    def skip_features(self) -> None:
        """Committed positions went through the target without features."""
        self.feature_gap = True

    def restart_features(self, pos: int) -> None:
        """Features resume at ``pos`` after a gap: the drafter's context starts over there (llama.cpp keeps each
        sequence's positions consecutive, so a gap cannot be left in its KV). The caller clears the drafter KV."""
        self.pending = []
        self.drafter_base = self.drafter_len = pos
        self.feature_gap = False

    def add_features(self, rows: np.ndarray | LayerRows, positions: np.ndarray) -> None:
        expected = self.n_featured
        if len(positions) and positions[0] != expected:
            raise InvariantError(
                f"slot {self.seq}: feature rows start at position {positions[0]}, expected {expected}"
            )
        self._pending.append(FeatureRows(rows, positions))
        self._pending_in_place |= isinstance(rows, LayerRows)
        if len(positions):
            self._pending_end = int(positions[-1]) + 1

    def settle_pending(self) -> None:
        """Copy out pending rows that are still in the target's buffers: its next forward overwrites them."""
        if self._pending_in_place:
            for p in self._pending:
                p.settle()
            self._pending_in_place = False

    def take_pending(self) -> list[FeatureRows]:
        """Hand over the pending rows, checked contiguous from drafter_len (the caller joins them with other slots'
        rows, so they are not concatenated here)."""
        parts, self.pending = self.pending, []
        expected = self.drafter_len
        for p in parts:
            n = len(p.positions)
            # a part's positions are an arange (Engine._keep_features), so its ends tell whether it continues
            # the previous one; a full comparison cost ~5 us a part, for every drafting slot in every step
            if n and (p.positions[0] != expected or p.positions[-1] != expected + n - 1):
                raise InvariantError(
                    f"slot {self.seq}: pending feature positions are not contiguous from {self.drafter_len}"
                )
            expected += n
        return parts
