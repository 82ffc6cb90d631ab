"""The target side: prefill prompts and verify draft spans, returning greedy picks and target features."""

from __future__ import annotations

import numpy as np

from ..errors import InvalidBatch
from ..native import Context, TokenBatch
from .slot import Slot


class Verifier:
    def __init__(self, ctx: Context, with_features: bool):
        self.ctx = ctx
        self.with_features = with_features
        self.batch = TokenBatch(ctx.params.n_batch)

    def prefill(self, slot: Slot, tokens: list[int]) -> None:
        """Run every prompt token but the last (the first anchor) through the target, n_batch at a time.

        Features of every chunk are kept (prompts longer than n_ubatch span several ubatches; upstream fills the
        layer-input buffer at each ubatch's offset, and we copy the whole batch's rows), unless the engine has
        extraction off: then the slot records a feature gap.
        """
        b = self.batch
        step = self.ctx.params.n_batch
        for i in range(0, len(tokens), step):
            chunk = tokens[i : i + step]
            b.clear()
            b.add(chunk, slot.n_past, slot.seq, False)
            self.ctx.decode(b)
            if self.with_features and self.ctx.features_on:
                slot.add_features(self.ctx.features(len(chunk)), np.arange(slot.n_past, slot.n_past + len(chunk), dtype=np.int32))
            elif self.with_features:
                slot.skip_features()
            slot.n_past += len(chunk)

    def verify(self, spans: list[tuple[Slot, list[int]]]) -> dict[int, tuple[list[int], np.ndarray | None, int]]:
        """One target forward over every slot's [anchor, drafts...].

        Returns per slot seq: (greedy picks t0..tK, feature rows of the span or None, first position). Rows are
        None when the engine has no drafter or has extraction off for this step.
        """
        b = self.batch
        b.clear()
        where = []
        for slot, drafts in spans:
            start = b.add([slot.anchor] + drafts, slot.n_past, slot.seq, True)
            where.append((slot, start, len(drafts) + 1))
        self.ctx.decode(b)
        feats = self.ctx.features(b.n) if self.with_features and self.ctx.features_on else None
        out = {}
        for slot, start, n in where:
            picks = self.ctx.picks(range(start, start + n))
            self._check_picks(slot, picks)
            rows = feats[start : start + n] if feats is not None else None
            out[slot.seq] = (picks, rows, slot.n_past)
        return out

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
