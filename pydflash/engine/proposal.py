"""Which proposal rejection sampling drafts from, chosen per request as it runs.

Rejection sampling keeps the target's distribution for any proposal that is fixed before a step's draws. Two are
at hand from one drafter forward (its dist chain gives q for every block row):
- ``sample``: draft x ~ q_i, accepted with probability min(1, p_i(x) / q_i(x)). Row 0 accepts sum_x min(p, q).
- ``argmax``: draft x = argmax q_i, a point mass; the same rule then accepts with probability p_i(x) and
  recovers from p without x, which is sample-and-match (accept iff the target's own sample equals the draft).
  Row 0 accepts p(argmax q).

Neither wins everywhere. A drafter less confident than the target (the shipped Gemma pair at temperature 0.7:
max q 0.75 against max p 0.86) gives argmax the edge; at temperature 1.0 sampling wins. Both row-0 rates can be
computed after every step from the two rows already on the host, whichever proposal was used, so the choice
needs no exploration: each request keeps a running mean of both and drafts from the better one. Later rows
favour argmax (DFlash samples block positions independently, so a sampled chain is less coherent than the argmax
chain), hence the margin sampling must win by.

The choice depends only on the request's own past steps, so a seeded request stays reproducible under the same
batch composition (``Request``'s seed promise).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from . import rejection

DECAY = 0.9  # running means over roughly the last 10 steps
SAMPLE_MARGIN = 1.25  # sampling must accept 25% more at row 0 to be chosen (see above)


def row0_rates(p_row, q_row, n_vocab: int) -> Optional[tuple[float, float]]:
    """(sum_x min(p, q), p(argmax q)) for one block row, or None where a row could not be read. q's row is short
    (the drafter chain's top-k, ``request.DRAFT_TOP_K``), so the sum runs over its candidates only: tokens outside
    them have q = 0 and add nothing."""
    if p_row is None or q_row is None:
        return None
    q_ids, q_probs = q_row
    if q_ids is None:
        q_ids = np.arange(len(q_probs))
    p = rejection.dense(p_row, n_vocab)
    p_at = p[q_ids]
    return float(np.minimum(p_at, q_probs).sum()), float(p_at[int(np.argmax(q_probs))])


def argmax_of(q_row) -> Optional[int]:
    """The likeliest token of a drafter row, or None where the row could not be read."""
    if q_row is None:
        return None
    ids, probs = q_row
    j = int(np.argmax(probs))
    return j if ids is None else int(ids[j])


@dataclass
class Proposal:
    """One request's running row-0 acceptance under both proposals."""

    sample_rate: Optional[float] = None
    argmax_rate: Optional[float] = None

    @property
    def argmax(self) -> bool:
        """Draft the argmax chain this step. Before any observation: argmax (llama.cpp's sample-and-match)."""
        if self.sample_rate is None:
            return True
        return self.sample_rate < SAMPLE_MARGIN * self.argmax_rate

    def observe(self, rates: Optional[tuple[float, float]]) -> None:
        if rates is None:
            return
        if self.sample_rate is None:
            self.sample_rate, self.argmax_rate = rates
            return
        self.sample_rate = DECAY * self.sample_rate + (1 - DECAY) * rates[0]
        self.argmax_rate = DECAY * self.argmax_rate + (1 - DECAY) * rates[1]
