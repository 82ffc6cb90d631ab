"""Acceptance rules: pure functions over token lists, tested directly.

Glossary (used throughout pydflash):
- anchor:   the last committed token; its target features are not known yet (it has not been through the target).
- draft block: ``[anchor, MASK x K]`` for the drafter; its argmax at block positions 1..K are the drafts d1..dK.
- verify span: ``[anchor, d1..dK]`` for the target, which returns its greedy pick t0..tK at each position.
- accepted: the longest prefix with d_i == t_{i-1}; m tokens (0 <= m <= K).
- bonus:    t_m, the target's own next token after the accepted prefix (always correct).
- commit:   accepted + bonus, 1..K+1 tokens. The bonus becomes the next anchor.
- rollback: everything written past the committed positions is removed from both KV caches.
- target features: layer-input hidden states of the target at committed positions, injected into the drafter KV.
"""

from __future__ import annotations

import math
import random
from typing import Sequence


def greedy_accept(drafts: Sequence[int], target: Sequence[int]) -> int:
    """Number of accepted drafts m: drafts[i] == target[i] for all i < m (target[i] follows drafts[:i])."""
    if len(target) != len(drafts) + 1:
        raise ValueError(f"target picks ({len(target)}) must be drafts ({len(drafts)}) + 1")
    m = 0
    for d, t in zip(drafts, target):
        if d != t:
            break
        m += 1
    return m


def commit_tokens(drafts: Sequence[int], target: Sequence[int], m: int) -> list[int]:
    """accepted drafts + bonus."""
    return list(drafts[:m]) + [target[m]]


def synthetic_rate(mean_len: float, k: int) -> float:
    """Per-position conditional acceptance p such that E[m] + 1 == mean_len with m ~ truncated geometric(p).

    E[m] = p + p^2 + ... + p^k. Mirrors llama.cpp's --spec-synth-len (common_speculative_synth_rates_resolve).
    """
    if k < 1:
        raise ValueError("synthetic acceptance needs at least one draft")
    if not (math.isfinite(mean_len) and 1.0 <= mean_len <= k + 1):
        raise ValueError(f"synthetic acceptance length must lie in [1, {k + 1}], got {mean_len}")
    if mean_len == k + 1:
        return 1.0
    lo, hi = 0.0, 1.0
    for _ in range(48):
        mid = 0.5 * (lo + hi)
        expect = sum(mid**j for j in range(1, k + 1))
        lo, hi = (mid, hi) if expect < mean_len - 1.0 else (lo, mid)
    return 0.5 * (lo + hi)


def synthetic_accept(n_drafts: int, p: float, rng: random.Random) -> int:
    """Accept each next draft with probability p until the first rejection (benchmarking only)."""
    m = 0
    while m < n_drafts and rng.random() < p:
        m += 1
    return m
