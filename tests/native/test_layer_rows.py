"""Target feature rows read in place (``LayerRows``): the same values as a copy, refused once the target's next
forward has overwritten them, and kept by a slot across that forward only when copied out first."""

from __future__ import annotations

import numpy as np
import pytest

from pydflash.engine.slot import Slot
from pydflash.errors import InvariantError
from pydflash.native import Context, ContextParams, Model, TokenBatch


@pytest.fixture
def target(tiny):
    p = tiny("gemma3")
    model = Model(p.target)
    layers = (1, 2)
    ctx = Context(model, ContextParams(n_ctx=128, n_batch=32, n_ubatch=16, feature_layers=layers))
    return ctx, model.n_embd, layers


def decode(ctx, tokens, pos0):
    b = TokenBatch(32)
    b.add(tokens, pos0, 0, True)
    ctx.decode(b)


def test_in_place_rows_equal_the_copy_and_go_stale_at_the_next_forward(target):
    ctx, n_embd, layers = target
    decode(ctx, list(range(10, 30)), 0)  # 20 tokens: two ubatches
    rows = ctx.layer_rows(20)
    full = ctx.features(20)
    assert rows.width == len(layers) * n_embd
    assert np.array_equal(rows.array(), full)
    part = rows.sub(5, 7)
    assert np.array_equal(part.array(), full[5:12])
    out = np.zeros((9, rows.width), dtype=np.float32)  # copy_into a slice of a larger batch buffer
    part.copy_into(out[1:8])
    assert np.array_equal(out[1:8], full[5:12]) and not out[0].any() and not out[8].any()
    assert len(rows.sub(18, 10)) == 2  # clipped to the rows there are
    decode(ctx, [40, 41], 20)
    assert rows.stale
    with pytest.raises(InvariantError, match="overwrote"):
        part.array()


def test_a_slot_keeps_pending_rows_across_a_forward_only_once_settled(target):
    ctx, _, _ = target
    decode(ctx, list(range(10, 30)), 0)
    expected = ctx.features(20)

    def slot_with_pending():
        s = Slot(seq=0, request=None, prompt=[], draft_max=0, stats=None, text=None)
        s.add_features(ctx.layer_rows(20).sub(0, 12), np.arange(0, 12, dtype=np.int32))
        s.add_features(ctx.layer_rows(20).sub(12, 8), np.arange(12, 20, dtype=np.int32))
        return s

    kept, lost = slot_with_pending(), slot_with_pending()
    kept.settle_pending()
    decode(ctx, [40, 41], 20)  # the next target forward overwrites the buffers
    assert np.array_equal(np.concatenate([p.array() for p in kept.take_pending()]), expected)
    with pytest.raises(InvariantError):
        [p.array() for p in lost.take_pending()]
