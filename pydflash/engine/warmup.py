"""Each context's largest batch, run once when a GPU engine is made, before any request can meet it.

On the H200 a batch shape's first run costs far more than its later ones, and in proportion to its tokens: the first
step in which every slot drafted a whole block took 79 ms at 1 slot, 409 ms at 4, 752 ms at 8 and 1.9 s at 16, in
the drafter and the target alike, and a few ms each time after (docs/benchmarks.md, step trace). Smaller shapes
seen for the first time after a larger one cost little more than usual, so what grows is memory the backend keeps,
sized by the largest batch it has run. One forward at each context's largest batch moves that cost to load time,
where no request waits on it, and keeps it out of the step costs adaptive drafting learns from.

Everything written is cleared again: both KV caches end empty, as a new engine's are.
"""

from __future__ import annotations

import logging
import time

import numpy as np

from ..native import Context, TokenBatch

log = logging.getLogger(__name__)


def warm_up(target: Context, drafter: Context | None, n_slots: int, span: int, block: int, token: int) -> float:
    """Run the largest batches: every slot's verify span with all rows outputs and the largest prompt chunk on the
    target; every slot's draft block and a full injection on the drafter. Returns the seconds it took."""
    t0 = time.perf_counter()
    per_slot = target.params.n_ctx // n_slots  # what one sequence may hold in either KV layout (a pool or streams)
    if span <= per_slot:  # a verify of every slot's whole span (the most output rows a step can have)
        b = TokenBatch(target.params.n_batch)
        b.add_spans([([token] * span, 0, seq) for seq in range(n_slots)], True)
        target.decode(b)
        width = target.layer_rows(b.n).width if target.params.feature_layers and target.features_on else 0
        target.clear()
        chunk = min(target.params.n_batch, per_slot)
        if chunk > b.n:  # and the largest prompt chunk (one output row)
            b.clear()
            b.add([token] * chunk, 0, 0, [False] * (chunk - 1) + [True])
            target.decode(b)
            target.clear()
        if drafter is not None and block <= per_slot:
            b = TokenBatch(drafter.params.n_ubatch)
            b.add_spans([([token] * block, 0, seq) for seq in range(n_slots)], True)
            drafter.decode(b)
            drafter.clear()
            if width:  # a full injection chunk of feature rows
                rows = min(drafter.params.n_ubatch, per_slot)
                drafter.inject(np.zeros((rows, width), dtype=np.float32), np.arange(rows, dtype=np.int32),
                               np.zeros(rows, dtype=np.int32))
                drafter.clear()
    seconds = time.perf_counter() - t0
    log.info("warm-up: the largest batches of both contexts in %.0f ms", 1e3 * seconds)
    return seconds
