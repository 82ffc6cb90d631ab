"""The target side: verify draft spans (and carry prompt chunks), returning the target's picks (argmax or samples),
target features, and on request the distributions it sampled from."""

from __future__ import annotations

from typing import Callable, Optional

from ..errors import InvalidBatch, InvariantError
from ..native import Context, TokenBatch
from ..native.features import LayerRows
from .slot import Slot


class Verifier:
    def __init__(self, ctx: Context, with_features: bool, window_guard: Optional[tuple[int, int]] = None):
        """window_guard: (a spare sequence id, the target's sliding window) for an SWA target (``_guard``)."""
        self.ctx = ctx
        self.with_features = with_features
        self.guard_seq, self.n_swa = window_guard or (-1, 0)
        self.batch = TokenBatch(ctx.params.n_batch)
        self._spans: dict[int, int] = {}  # seq -> batch index of its anchor in the last forward
        self._epoch = -1  # ctx.n_decodes of that forward

    def verify(self, spans: list[tuple[Slot, list[int]]], chunks: list[tuple[Slot, list[int]]] = (),
               during: Optional[Callable[[], None]] = None) -> dict[int, tuple[list[int], LayerRows | None, int]]:
        """One target forward over every running slot's [anchor, drafts...] and the next prompt chunk of every
        slot still prefilling (chunk tokens are not outputs).

        Returns per slot seq: (picks t0..tK, [] for a chunk; the feature rows of its tokens or None; its first
        position). Rows are None when the engine has no drafter or has extraction off for this step; else they are
        ``LayerRows``, still in llama.cpp's buffers, readable until the target's next forward. ``during``: host work
        run while the device computes the forward (``Context.decode``). Features
        cover every token of the batch, across ubatches (upstream fills the layer-input buffer at each ubatch's
        offset), so a slot's rows are the batch rows it occupies.
        """
        b = self.batch
        b.clear()
        starts = b.add_spans([([slot.anchor] + drafts, slot.n_past, slot.seq) for slot, drafts in spans], True)
        where = [(slot, start, len(drafts) + 1, True) for (slot, drafts), start in zip(spans, starts)]
        for slot, chunk in chunks:
            where.append((slot, b.add(chunk, slot.n_past, slot.seq, False), len(chunk), False))
        guarded = self._guard(spans, b.n)
        try:
            self.ctx.decode(b, during)
        finally:
            if guarded:  # the guard's share only (the slots keep their cells), queued with the step's rollbacks:
                self.ctx.seq_rm_later(self.guard_seq, 0)  # made while the next drafter forward runs
        feats = self.ctx.layer_rows(b.n) if self.with_features and self.ctx.features_on else None
        # the spans came first, every row an output: all their picks in one read (one backend synchronization)
        # (a slot sampled on the host has no backend chain: its rows hold no pick, the caller reads its logits)
        all_picks = self.ctx.picks(range(sum(n for _, _, n, is_span in where if is_span)))
        if all_picks and (min(all_picks) < 0 or max(all_picks) >= self.ctx.n_vocab):  # one check for the batch
            for slot, start, n, is_span in where:
                self._check_picks(slot, all_picks[start : start + n] if is_span and slot.host is None else [])
        out = {}
        for slot, start, n, is_span in where:
            picks = all_picks[start : start + n] if is_span and slot.host is None else []
            rows = feats.sub(start, n) if feats is not None else None
            out[slot.seq] = (picks, rows, slot.n_past)
        self._spans = {slot.seq: start for slot, start, _, is_span in where if is_span}
        self._epoch = self.ctx.n_decodes
        return out

    def _guard(self, spans: list[tuple[Slot, list[int]]], n_tokens: int) -> bool:
        """Keep the SWA cells a rollback will need from being overwritten during the verify forward.

        llama.cpp gives a new token any SWA cell that is masked for its only sequence, judged by that sequence's
        largest position. A span [anchor at p, drafts up to p + k] raises it to p + k, which masks the cells at
        positions up to p + k + 1 - n_swa while the forward runs; a later ubatch of the same forward (another
        slot's span, a prompt chunk) may then take them. After a rollback to p + m + 1 the next token attends from
        p + m + 2 - n_swa on, so with m < k it would attend over holes: plain decoding never masks those cells, and
        the output differed from it (greedy, on a tiny Gemma-3 with 4 slots). A cell that a second sequence shares
        is never given away, so each drafting slot's [p + 2 - n_swa, p + k + 2 - n_swa) is shared with the guard
        sequence for the forward (``seq_cp`` in the unified KV: bookkeeping, no copy). Returns whether it shared
        any.

        A forward of one ubatch finds all its cells before any position moves, so it needs no guard: on a GPU
        (n_ubatch 512) that is every step without a long prompt chunk. Each ``seq_cp`` walks every KV cell
        (~30 us at 65,536 cells on this project's CPU host), so the guard is kept to the forwards that need it."""
        if self.n_swa <= 0 or n_tokens <= self.ctx.params.n_ubatch:
            return False
        guarded = False
        for slot, drafts in spans:
            lo, hi = max(0, slot.n_past + 2 - self.n_swa), slot.n_past + len(drafts) + 2 - self.n_swa
            if hi > lo:
                self.ctx.seq_cp(slot.seq, self.guard_seq, lo, hi)
                guarded = True
        return guarded

    def p(self, seq: int, i: int):
        """p_i: the distribution the target's chain sampled verify row i of this sequence from, after its
        transforms (``SampledRow``; needs a dist chain). Valid until the target's next forward."""
        if self.ctx.n_decodes != self._epoch or seq not in self._spans:
            raise InvariantError(f"target probabilities of sequence {seq} read after another target forward")
        return self.ctx.sampled(self._spans[seq] + i)

    def logits(self, seq: int, i: int):
        """Verify row i's full logits ([V] float32, a copy) for a sequence without a backend sampler chain."""
        if self.ctx.n_decodes != self._epoch or seq not in self._spans:
            raise InvariantError(f"target logits of sequence {seq} read after another target forward")
        return self.ctx.logits(self._spans[seq] + i)

    def _check_picks(self, slot: Slot, picks: list[int]) -> None:
        """A target pick outside the vocabulary (-1: no sample, or CUDA's argmax over NaN logits) would be committed
        and fed back as the next anchor: stop here with the cause instead."""
        n_vocab = self.ctx.n_vocab
        bad = [p for p in picks if not 0 <= p < n_vocab]
        if bad:
            raise InvalidBatch(
                f"the target returned token id {bad[0]} for sequence {slot.seq} at position {slot.n_past}: no sample "
                f"(NaN or -inf logits on the backend?)"
            )
