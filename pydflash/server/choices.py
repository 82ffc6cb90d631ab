"""``n`` choices per prompt: how many, and each one's seed.

Each choice is a request of its own to the engine. With a ``seed`` its choices must differ from each other and be
reproducible, so choice j's seed is a mix of the request's seed and j (choice 0 keeps the seed itself: ``n: 1``
gives what it gave before ``n`` existed); without one every choice draws fresh entropy in the engine.
"""

from __future__ import annotations

import hashlib
from typing import Optional

from .errors import InvalidRequestError


def n_choices(body, n_slots: int) -> int:
    """The body's ``n`` (1 when absent), at most the engine's slots: more could not run side by side, and they
    share the prompt's prefill only while it is in the KV. ``best_of`` is applied only where it equals ``n``."""
    n = body.n or 1
    if n > n_slots:
        raise InvalidRequestError(f"n is {n}; this model serves at most {n_slots} choices per prompt (its slots)",
                                  param="n")
    if body.best_of is not None and body.best_of != n:
        raise InvalidRequestError(
            f"best_of ({body.best_of}) must equal n ({n}): choosing the best of several generations needs a score "
            "per choice (their log-probability under the model), which the server does not compute; ask for n "
            "choices with logprobs and rank them yourself", param="best_of")
    return n


def choice_seed(seed: Optional[int], index: int) -> Optional[int]:
    if seed is None or index == 0:
        return seed
    digest = hashlib.blake2b(f"{seed}:{index}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "little")
