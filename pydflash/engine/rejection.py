"""Rejection sampling over a draft block (Leviathan et al. 2023; Chen et al. 2023): pure functions, tested directly.

Terms as in ``accept.py``, plus:
- p_i: the target's distribution at verify row i (the token after ``[anchor, d1..di]``), after the request's
  top-k, top-p and temperature, exactly as its backend chain samples it (0 for a filtered token).
- q_i: the drafter's distribution at block position i + 1, after the same transforms; draft d_{i+1} is a sample
  of q_i. A drafter with a reduced head (d2t) scatters its logits into the full vocabulary with -inf elsewhere,
  so tokens outside its head have q = 0. Upstream's DFlash-1 graph applies no logit softcap (the target's cap
  is only carried as metadata), so q is over uncapped logits even for a capped target: any q keeps the output
  exact, a q further from p only accepts less.
- recovered: the token committed at the first rejected row i, a sample of norm(max(0, p_i - q_i)).

The rule: draft x at row i is accepted with probability min(1, p_i(x) / q_i(x)); the first rejection commits a
recovered token and ends the step; if all K drafts are accepted the bonus is a sample of p_K (the target's own
sample at row K). Each committed token is then distributed exactly as p given the tokens before it.

Rows are given as ``(ids, probs)`` pairs (``native.context.SampledRow``): ``probs[j]`` belongs to token
``ids[j]``, or to token j when ``ids`` is None; None where llama.cpp's row did not hold together, and the block
then finishes as sample-and-match (``speculative_commit``).
"""

from __future__ import annotations

import random
from typing import Callable, Optional, Sequence

import numpy as np

from .accept import greedy_accept

# top-p leaves the whole vocabulary sorted by probability: a draft is nearly always near the front
_HEAD = 256


def prob_of(row, token: int) -> Optional[float]:
    """The probability a row gives one token (0 if its filters removed it); None for no row."""
    if row is None:
        return None
    ids, probs = row
    if ids is None:
        return float(probs[token]) if 0 <= token < len(probs) else 0.0
    hit = np.flatnonzero(ids[:_HEAD] == token)
    if not len(hit) and len(ids) > _HEAD:
        hit = _HEAD + np.flatnonzero(ids[_HEAD:] == token)
    return float(probs[hit[0]]) if len(hit) else 0.0


def dense(row, n_vocab: int) -> np.ndarray:
    """A row as a [n_vocab] vector (vocabulary-sized: only for the one rejected row of a step). A row over the
    whole vocabulary in id order is returned as it is (a view, no copy). A top-p row lists the whole vocabulary
    sorted by probability with zeros past the nucleus: only its positive prefix is scattered (the full scatter
    cost ~1 ms at 262k tokens)."""
    ids, probs = row
    if ids is None and len(probs) == n_vocab:
        return probs
    out = np.zeros(n_vocab, dtype=probs.dtype)
    if ids is None:
        out[: len(probs)] = probs
        return out
    nz = int(np.count_nonzero(probs))
    if nz < len(probs) and probs[nz - 1] > 0 and not probs[nz:].any():  # zeros only past a positive prefix
        ids, probs = ids[:nz], probs[:nz]
    out[ids] = probs
    return out


def residual_weights(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """max(0, p - q), unnormalised ([V]; ``sample`` normalises). Where p <= q everywhere (p == q up to float
    noise) a rejection had probability ~0, and p itself is the right answer."""
    r = np.maximum(p - q, 0.0)
    return r if r.any() else p


def residual(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """norm(max(0, p - q)): what a rejection commits from. p, q: [V]."""
    r = residual_weights(p, q).astype(np.float64)
    return r / r.sum()


_BLOCK = 1024  # sample()'s two-level search: block sums, then one block's running sum


def sample(weights: np.ndarray, u: float) -> int:
    """Inverse-CDF sample of [V] non-negative weights (normalised here) with a uniform u in [0, 1); never a
    zero-weight index.

    Two levels instead of one float64 cumsum over the vocabulary (2.2 ms at 262k tokens, most of a rejected
    step's host time on the H200): sums of 1024-weight blocks, their float64 running sum to find the block, then
    the running sum inside that block alone (~0.2 ms in all)."""
    n = len(weights)
    n_full = n - n % _BLOCK
    sums = weights[:n_full].reshape(-1, _BLOCK).sum(axis=1, dtype=np.float64)
    if n_full < n:
        sums = np.append(sums, weights[n_full:].sum(dtype=np.float64))
    cdf = np.cumsum(sums)
    target = u * cdf[-1]
    b = min(int(np.searchsorted(cdf, target, side="right")), len(cdf) - 1)
    lo = b * _BLOCK
    block = weights[lo : lo + _BLOCK]
    inner = np.cumsum(block, dtype=np.float64) + (cdf[b - 1] if b else 0.0)
    j = int(np.searchsorted(inner, target, side="right"))
    if j >= len(block) or block[j] <= 0:  # target rounded onto the block's end: its last positive weight
        pos = np.flatnonzero(block > 0)
        return lo + int(pos[-1]) if len(pos) else int(np.flatnonzero(weights > 0)[-1])
    return lo + j


def accepts(p_x: float, q_x: float, u: float) -> bool:
    """Accept a draft with probability min(1, p/q) given a uniform u in [0, 1): q <= p always accepts. q == 0 (a
    draft its own distribution cannot produce) never does, and the residual is then p itself."""
    return q_x > 0.0 and u * q_x < p_x


def speculative_commit(
    drafts: Sequence[int],
    picks: Sequence[int],
    p_of: Callable[[int], Optional[float]],
    q_of: Callable[[int], Optional[float]],
    rows: Callable[[int], tuple[np.ndarray, np.ndarray]],
    rng: random.Random,
) -> tuple[int, list[int]]:
    """Accepted count m and committed tokens (accepted drafts + one recovered or bonus token).

    drafts:  [K] token ids, drafts[i] a sample of q_i
    picks:   [K + 1] the target chain's own samples, picks[i] of p_i; picks[K] is the bonus
    p_of(i): p_i(drafts[i]); q_of(i): q_i(drafts[i]); None where that row could not be read (read lazily:
             nothing past a rejection is read)
    rows(i): (p_i, q_i) as dense [V] vectors, read only at the rejected row
    rng:     the request's own stream: one uniform per examined draft, one more on a rejection

    From a row that could not be read on, the block finishes as sample-and-match: a draft is kept iff it equals
    the target's sample there, so the committed token is that sample whatever the draft: exact as well. The
    switch must be decided before that row's acceptance test: switching only after a rejection would commit p
    on the rejected branch alone, and the row's marginal would no longer be p.
    """
    for i, _ in enumerate(drafts):
        p_x, q_x = p_of(i), q_of(i)
        if p_x is None or q_x is None:
            m = i + greedy_accept(drafts[i:], picks[i:])
            return m, list(drafts[:m]) + [picks[m]]
        if not accepts(p_x, q_x, rng.random()):
            p, q = rows(i)
            return i, list(drafts[:i]) + [sample(residual_weights(p, q), rng.random())]
    return len(drafts), list(drafts) + [picks[len(drafts)]]


def first_token_marginal(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Exact distribution of the first committed token for one row (the identity behind the method):
    sum_x q(x) [min(1, p/q) 1{x = t} + (1 - min(1, p/q)) r(t)], r = residual(p, q). Equals p. p, q: [V]."""
    ratio = np.divide(p, q, out=np.zeros_like(p), where=q > 0)
    keep = q * np.minimum(1.0, ratio)  # q(x) min(1, p(x)/q(x)) = min(q(x), p(x))
    return keep + (1.0 - keep.sum()) * residual(p, q)


def seeded_rng(seed: int, salt: int) -> random.Random:
    """A request's stream for one purpose (salt), reproducible from its seed and independent of the others."""
    return random.Random((int(seed) << 8) ^ (salt & 0xFF))


def drafter_seed(seed: int) -> int:
    """The drafter chain's seed: the request's, mixed so its draws never line up with the target chain's."""
    return (int(seed) * 0x9E3779B1 + 0x7F4A7C15) & 0xFFFFFFFF
