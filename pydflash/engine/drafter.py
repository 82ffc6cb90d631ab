"""The drafter side of a step: inject committed target features, then propose a draft block per slot.

One drafter forward covers every drafting slot's noise block ``[anchor, MASK x K]`` (non-causal inside each block;
the unified KV mask keeps sequences apart). The noise block writes its own K/V at [n_past, n_past + K]; it must be
removed before the committed features are injected at those positions, or it would pollute the next draft. The
engine removes the blocks (``drop_blocks``) while the target's verify forward runs on the device: on the H200 those
16 rollbacks of a 16-slot step cost ~0.25 ms of host time that nothing else overlapped (docs/benchmarks.md).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import numpy as np

from ..errors import InvariantError
from ..native import Context, TokenBatch
from .proposal import argmax_of
from .slot import Slot

log = logging.getLogger(__name__)

MAX_PENDING_ROWS = 256


@dataclass(frozen=True)
class ProposeCost:
    """Wall seconds of the last ``propose``: the feature injection (``rows`` of them) and the block forward."""

    inject_s: float = 0.0
    rows: int = 0
    block_s: float = 0.0


NO_COST = ProposeCost()


class Drafter:
    def __init__(self, ctx: Context, block_size: int, mask_token: int):
        self.ctx = ctx
        self.block_size = block_size
        self.mask_token = mask_token
        self.batch = TokenBatch(ctx.params.n_ubatch)
        self.n_invalid = 0  # draft blocks cut at an id outside the vocabulary (see _valid_prefix)
        self._blocks: dict[int, int] = {}  # seq -> batch index of its block's anchor in the last forward
        self._epoch = -1  # ctx.n_decodes of that forward
        self.last_cost = ProposeCost()
        self._rows: np.ndarray | None = None  # the injection batch's rows (_rows_buffer)
        self._written: list[tuple[int, int]] = []  # (seq, first position) of noise blocks still in the drafter KV

    def inject(self, slots: list[Slot]) -> int:
        """Write every pending feature row of these slots into the drafter KV, in n_ubatch chunks; returns how many.
        The rows are gathered into one batch buffer, most of them straight from the target's buffers."""
        parts = [(slot, p) for slot in slots for p in slot.take_pending()]
        if not parts:
            return 0
        n = sum(len(p.positions) for _, p in parts)
        rows = self._rows_buffer(n, parts[0][1].width)
        at = 0
        for _, p in parts:
            p.copy_into(rows[at : at + len(p.positions)])
            at += len(p.positions)
        pos = np.concatenate([p.positions for _, p in parts])
        seqs = np.concatenate([np.full(len(p.positions), s.seq, dtype=np.int32) for s, p in parts])
        step = self.ctx.params.n_ubatch
        for i in range(0, n, step):
            self.ctx.inject(rows[i : i + step], pos[i : i + step], seqs[i : i + step])
        for slot, p in parts:
            slot.drafter_len += len(p.positions)
        return n

    def _rows_buffer(self, n: int, width: int) -> np.ndarray:
        """[n, width] float32, C-contiguous, reused across steps (llama.cpp reads it only during the decode)."""
        buf = self._rows
        if buf is None or buf.shape[0] < n or buf.shape[1] != width:
            buf = self._rows = np.empty((max(n, 2 * (0 if buf is None else buf.shape[0])), width), dtype=np.float32)
        return buf[:n]

    def propose(self, plan: list[tuple[Slot, int]], during=None) -> dict[int, list[int]]:
        """Drafts per slot seq for every (slot, K>0) in plan, from one batched drafter forward.

        Drafting slots first get their pending features injected; a slot that is not drafting keeps collecting
        them (no drafter work while adaptive drafting has it paused) until MAX_PENDING_ROWS. ``during``: host
        work run while the block forward is on the device (``Context.decode``), if there is one.
        """
        self.drop_blocks()  # normally done during the last verify; a step that failed before it leaves them
        drafting = [(s, k) for s, k in plan if k > 0]
        injecting = [s for s, k in plan if k > 0 or s.n_pending >= MAX_PENDING_ROWS]
        if not injecting:  # nothing for the drafter to do: a paused engine's every step
            self.last_cost = NO_COST
            return {}
        t0 = time.perf_counter()
        rows = self.inject(injecting)
        t1 = time.perf_counter()
        self.last_cost = ProposeCost(t1 - t0, rows)
        if not drafting:
            return {}
        b = self.batch
        b.clear()
        # every block position is an output, the anchor's too: the dflash graph computes logits for all rows of the
        # block, and with the anchor left out llama.cpp's output rows shift by one against the batch (the draft
        # read at block position 1 would be the anchor's own prediction)
        starts = b.add_spans([([slot.anchor] + [self.mask_token] * k, slot.n_past, slot.seq) for slot, k in drafting],
                             True)
        where = [(slot, start, k) for (slot, k), start in zip(drafting, starts)]
        self.ctx.decode(b, during=during)
        all_picks = self.ctx.picks(range(b.n))  # every block row is an output: one read for all of them
        drafts = {}
        for slot, start, k in where:
            if slot.host is not None:  # no backend chain: drafts drawn on the host from the block's logits rows
                drafts[slot.seq] = slot.host.draft(lambda i, s=start: self.ctx.logits(s + 1 + i), k)
                continue
            raw = all_picks[start + 1 : start + 1 + k]
            if slot.proposal is not None and slot.proposal.argmax:  # rejection sampling from q's argmax (proposal.py)
                tops = [argmax_of(self.ctx.sampled(start + 1 + i)) for i in range(k)]
                drafts[slot.seq] = self._valid_prefix(tops[: tops.index(None)] if None in tops else tops)
            else:
                drafts[slot.seq] = self._valid_prefix(raw)
            # a sampling chain drew one uniform per block row from a scratch copy of its stream: advance the stream
            # past all of them, or the next block would reuse the same draws (a no-op for a greedy chain)
            self.ctx.accept(slot.seq, [slot.anchor] + raw)
        self._written = [(slot.seq, slot.n_past) for slot, _ in drafting]  # the noise blocks' own K/V (drop_blocks)
        self._blocks = {slot.seq: start for slot, start, _ in where}
        self._epoch = self.ctx.n_decodes
        self.last_cost = ProposeCost(t1 - t0, rows, time.perf_counter() - t1)
        return drafts

    def drop_blocks(self) -> None:
        """Remove the last forward's noise blocks from the drafter KV (before the drafter's next forward, and before
        anything reads that KV: the engine calls this during the verify)."""
        written, self._written = self._written, []
        for seq, pos in written:
            self.ctx.seq_rm(seq, pos)

    def q(self, seq: int, i: int):
        """q_i: the distribution draft i (0-based) of this sequence's last block was sampled from, after its
        chain's transforms (``SampledRow``; needs a dist chain). Valid until the drafter's next forward."""
        if self.ctx.n_decodes != self._epoch or seq not in self._blocks:
            raise InvariantError(f"drafter probabilities of sequence {seq} read after another drafter forward")
        return self.ctx.sampled(self._blocks[seq] + 1 + i)

    def _valid_prefix(self, drafts: list[int]) -> list[int]:
        """Drafts up to the first one that is not a vocabulary id. A backend sampler leaves -1 in a row it did not
        sample, and CUDA's argmax returns -1 for a row of NaN or -inf logits (a broken or overflowing drafter);
        such an id must never reach the target's batch. Drafts after it could not be accepted anyway (the
        target's pick there is always a real token), so cutting the block loses nothing and output stays exact."""
        n_vocab = self.ctx.n_vocab
        for i, d in enumerate(drafts):
            if not 0 <= d < n_vocab:
                self.n_invalid += 1
                if self.n_invalid == 1:
                    log.warning("the drafter returned token id %d (no token: NaN/inf logits?); drafts are cut there",
                                d)
                return drafts[:i]
        return drafts
