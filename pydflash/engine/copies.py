"""Copies where the drafter does not draft: a slot whose text repeats verifies what followed the same words before.

Why: a drafter that does not suit the traffic is paused (adaptive.py), and then nothing drafts, though the text
itself may be a loop. Greedy continuations run past a natural end (``ignore_eos``, long ``max_tokens``) fall into
repeating themselves more often than not: over 256 tokens of Gemma-3-270M on the drafter's held-out prompts
(``pydflash/train/eval_fresh_v1.jsonl``, plain greedy on a CPU), a copy verified wherever the history's end matched
LONG_MATCH tokens or more would have been accepted at 0.9 of its drafts on chat and prose, 0.5-0.66 on code and
repetition prompts, for 4.6 committed tokens a step over all 108 prompts. Such a copy costs no drafter forward and
no target features, only its verify tokens, so it is chosen on its own terms, not the drafter's:

- a candidate is a slot that may draft, left at 0 drafts by the plan, whose history ends in a match of LONG_MATCH
  tokens or more (``lookup.History.continuation``): a shorter match copies the previous record of a list, where the
  next one is not the same (lookup.py);
- its K maximises E(K) - lam * c_v * K, where E comes from the acceptance of the slot's own copies (decayed counts,
  ``adaptive.accept_curve``), lam is plain decoding's rate and c_v the verify curve's chord: an extra verify token
  must earn more than the time it costs at plain decoding's rate. Sizes above any measured verify are priced at the
  largest measured one (``StepCosts.verify_floor``): a copy step is always measured, so trying one teaches its cost;
- the step as a whole must beat plain decoding by adaptive.MARGIN, or no slot copies in it.

A slot's counts start as one copy accepted at START_RATE at every position. Whether a copy pays is only learned by
copying, so a start at even odds, with nothing else known, kept some engines from ever copying on a CPU (the first
decisions found a 1-copy step not worth it: 85 tok/s, where the same requests ran at 140 once copies began). Each
candidate step a slot sits out moves its counts back towards that start (``relax``): a text whose copies failed
early, and that loops later, copies again within ~30 candidate steps, at the cost of one trial.
The counts are the slot's own, not blended with the engine's as drafts are: whether a text repeats is the text's.

What copies earn is learned apart from the drafter's blocks: counted as the drafter's, copies made a useless drafter
look useful (lookup.would_accept). A copy verified this way leaves the slot without drafter features for its
positions when the step extracts none; the drafter's context then restarts where features resume, as after a pause.
"""

from __future__ import annotations

from typing import Optional

from .adaptive import MARGIN, AcceptCounts, accept_curve, best_ks
from .costs import StepCosts
from .lookup import LONG_MATCH, History


# Acceptance at every position that a slot's copy counts start from: over the held-out prompts (the module), a
# LONG_MATCH copy's drafts were accepted at 0.5-0.66 (code, repetition prompts) to 0.9 (chat, prose)
START_RATE = 0.8
RELAX = 0.97  # per candidate step sat out: the counts' share that stays (the rest is the start's)
_NO_PRIOR = AcceptCounts()  # accept_curve's prior: none


def start_counts() -> AcceptCounts:
    """A slot's copy counts before it copied: one observation accepted at START_RATE at every position."""
    counts = AcceptCounts()
    counts.drafted = [1.0] * len(counts.drafted)
    counts.accepted = [START_RATE] * len(counts.accepted)
    counts.weight = 1.0
    return counts


def relax(counts: AcceptCounts) -> None:
    """Move counts a step back towards ``start_counts`` (the module)."""
    keep = RELAX
    counts.drafted = [keep * d + (1 - keep) for d in counts.drafted]
    counts.accepted = [keep * a + (1 - keep) * START_RATE for a in counts.accepted]
    counts.weight = keep * counts.weight + (1 - keep)


class CopyPolicy:
    def __init__(self, costs: StepCosts):
        self.costs = costs  # the engine's cost curves (adaptive.DraftPolicy.costs), shared

    @staticmethod
    def candidate(history: Optional[History], k_max: int) -> list[int]:
        """The chain a slot would copy (k_max tokens), [] where its text's end does not repeat LONG_MATCH tokens."""
        if history is None or k_max <= 0:
            return []
        return history.continuation(k_max, LONG_MATCH)[0]

    def choose(self, n: int, candidates: list[tuple[AcceptCounts, int]], features: bool) -> list[int]:
        """K per candidate (its slot's copy counts, its draft_max) in a step of n running slots, target features on
        or off; all 0 where copying does not beat plain decoding."""
        c = self.costs
        plain, base = c.plain(n), c.verify(n, n, features)
        if not candidates or plain is None or base is None or plain <= 0.0:
            return [0] * len(candidates)  # nothing measured yet (the first steps of an engine)
        curves = [accept_curve(counts, _NO_PRIOR, m) for counts, m in candidates]
        maxes = [m for _, m in candidates]
        x = n + sum(maxes)
        cv = max(0.0, (c.verify_floor(n, x, features) - base) / (x - n))
        lam = n / plain
        ks = best_ks(curves, maxes, lam, cv, 0.0)
        extra = sum(ks)
        if extra:
            accepted = sum(e[k] for e, k in zip(curves, ks))
            if (n + accepted) / c.verify_floor(n, n + extra, features) < lam * (1.0 + MARGIN):
                ks = [0] * len(candidates)
        for (counts, _), k in zip(candidates, ks):
            if not k:
                relax(counts)
        return ks

    @staticmethod
    def observe(counts: AcceptCounts, n_drafts: int, n_accepted: int) -> None:
        counts.observe(n_drafts, n_accepted)
