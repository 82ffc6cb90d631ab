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
- its K maximises E(K) - lam * c_v * K, where E comes from the acceptance of the slot's own copies blended with
  the engine's (decayed counts, ``adaptive.accept_curve``, as for drafts), lam is plain decoding's rate and c_v the
  verify curve's chord: an extra verify token
  must earn more than the time it costs at plain decoding's rate. Sizes above any measured verify are priced at the
  largest measured one (``StepCosts.verify_floor``): a copy step is always measured, so trying one teaches its cost;
- the step as a whole must beat plain decoding by adaptive.MARGIN, or no slot copies in it.

Whether a copy pays is only learned by copying. The engine's counts start as one copy accepted at START_RATE at
every position: a start at even odds kept some engines from ever copying on a CPU (the first decisions found a
1-copy step not worth it: 85 tok/s, where the same requests ran at 140 once copies began). A slot starts with the
engine's evidence rather than at that start: on a GPU a verify jumps in cost with its first extra token (an H100, 4
slots: a copy step of ~20 copied tokens 4.0 ms, a plain step 1.4), so one looping slot among four must expect ~5
accepted drafts before its copy pays, which a slot at START_RATE never does. Through HTTP, at the load where one
loop seldom met another, copies did not start (tau 1.01 at 4 clients in one run, 2.0-5.0 at the others); the
engine on the tiny pair with the H100's costs modelled (``scripts/bench/copies_replay.py``, 3 seeds a load) took
651-804 steps for its looping requests' 800-1,000 tokens at 4 slots with per-slot evidence alone, 464-684 with the
engine's and trials (TRIAL_EVIDENCE); 1,256-1,456 -> 1,207-1,272 for 1,800-2,000 at 8; 2,713-3,001 -> 2,525-2,798
for 3,800 at 16. Each refusal fades a slot's own evidence (``relax``) and makes it wait RECHECK steps, so a text
whose copies failed early, and that loops later, is judged by the engine's evidence again; a step in which no slot
copies moves the engine's evidence back towards the start, so that traffic whose copies all failed tries again
after ~100 such steps.

Copies also stand in for the drafter's blocks where the plan drafts only for slots whose text is being copied
(``CopyPolicy.first``): lookup.choose would verify their copies and only score the blocks, so the drafter's forward
(1.0 of a 3.55 ms step at 1 slot on the H100) is skipped, and the copies are chosen here like any other. One such
step in CHECK_EVERY still drafts, so that a slot whose blocks beat its copies (records whose next one differs) is
found by its edge and drafts again. Measured on an H100 (scripts/bench/copy_first.py, docs/results/2026-12-06-h100-f):
1.20x / 1.17x the speed of drafting every planned block at 1 / 4 slots; at 8 the rounds spread more than the two
differ.

What copies earn is learned apart from the drafter's blocks: counted as the drafter's, copies made a useless drafter
look useful (lookup.would_accept). A copy verified this way leaves the slot without drafter features for its
positions when the step extracts none; the drafter's context then restarts where features resume, as after a pause.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from .adaptive import MARGIN, AcceptCounts, accept_curve, best_ks
from .costs import StepCosts
from .lookup import LONG_MATCH, Edge, History


# Acceptance at every position that the engine's copy counts start from: over the held-out prompts (the module), a
# LONG_MATCH copy's drafts were accepted at 0.5-0.66 (code, repetition prompts) to 0.9 (chat, prose)
START_RATE = 0.8
RELAX = 0.9  # per refusal: the share of a slot's own evidence that stays
# While the engine's evidence weighs less than this many (decayed) copies, candidates copy at the length each one's
# chances pay for, without the step's check against plain decoding: at START_RATE that check refused every step with
# one or two looping slots among 8-16 on the H100's costs (the verify's jump), so no copy ever taught the engine
# anything (the tiny pair with those costs: 2 and 8 copy steps in 248 and 511 candidate steps at 8 and 16 slots).
# The engine's evidence fades towards the start in steps without copies, so trials come back now and then.
TRIAL_EVIDENCE = 3.0
# A refused slot is not a candidate again for this many steps: whether a text repeats changes slowly, and deciding for
# 16 candidates took ~130 us of Python on this repository's CPU (4 % of a 16-slot GPU step), most of it refusals
RECHECK = 4
RELAX_ENGINE = 0.99  # per candidate step in which no slot copies: the share of the engine's that stays (the rest is
# the start's)
# A copy step's target batch is a multiple of this many tokens (fit_shape). llama.cpp reuses a built graph, and CUDA
# a captured one (patches/0007), only for a batch of the size it was made for, and copy lengths vary from step to
# step: the H100's traces had 30 batch sizes in 221 copy steps of 4 slots, and a size's first two steps (its
# warm-up and capture) took 4.5 ms against 3.9 later. With the sizes fitted (the same load, docs/results/
# 2026-12-06-h100-e): 10 sizes in 159 copy steps; a copy step's cost went with its tokens as before (4.4 ms for 22
# copied, 4.1 for 19.8 unfitted), so what this saves is the warm-ups, and fitting lengthens more copies than it trims
SHAPE_STEP = 8
# ... but a copy is shortened by at most this many tokens for it: a new size costs ~0.6 ms twice, once, while a
# copy's tail tokens are accepted at ~0.8 each in every step (the tiny pair with the H100's costs modelled,
# scripts/bench/copies_replay.py, docs/results/2026-12-06-cpu/copies_replay{,_fit_trim7,_fit}.json: with up to 7
# trimmed, 8-slot steps for the looping requests rose 1,207-1,272 -> 1,260-1,358; with 2, 1,141-1,341)
MAX_TRIM = 2
# Where every drafting slot's text is being copied, the drafter sits out the step (``CopyPolicy.first``), except for
# every this-many-th such step. The H100's traces: at 1 slot a step with a copy took 2.6 ms for 15 copied tokens, one
# with the shipped drafter's block 3.55 ms (1.0 of it the drafter's) for 7.1 drafts; at 4 slots 5.2 ms against 7.1
CHECK_EVERY = 4


def start_counts() -> AcceptCounts:
    """The engine's copy counts before any copy: one observation accepted at START_RATE at every position."""
    counts = AcceptCounts()
    counts.drafted = [1.0] * len(counts.drafted)
    counts.accepted = [START_RATE] * len(counts.accepted)
    counts.weight = 1.0
    return counts


def relax(counts: AcceptCounts, keep: float = RELAX, toward: AcceptCounts | None = None) -> None:
    """Keep ``keep`` of counts' evidence; the rest is toward's (None: no evidence)."""
    d0, a0, w0 = (toward.drafted, toward.accepted, toward.weight) if toward else (None, None, 0.0)
    counts.drafted = [keep * d + (1 - keep) * (d0[i] if d0 else 0.0) for i, d in enumerate(counts.drafted)]
    counts.accepted = [keep * a + (1 - keep) * (a0[i] if a0 else 0.0) for i, a in enumerate(counts.accepted)]
    counts.weight = keep * counts.weight + (1 - keep) * w0


@dataclass
class SlotCopies:
    """A slot's own evidence on its copies, and the steps it waits before it is a candidate again."""

    counts: AcceptCounts = field(default_factory=AcceptCounts)
    wait: int = 0


class CopyPolicy:
    def __init__(self, costs: StepCosts):
        self.costs = costs  # the engine's cost curves (adaptive.DraftPolicy.costs), shared
        self.prior = start_counts()  # the engine's evidence: every slot's copies, decayed
        self.first_steps = 0  # steps in which every drafting slot could copy instead (``first``)
        self.why = ""  # what ``first`` last decided, by its first reason (the step trace records it)

    def first(self, drafting: list[tuple[SlotCopies, Edge, Optional[History], int]]) -> bool:
        """Whether the plan's drafting slots (each one's copy state, copy edge, history and K) all copy instead, with
        no drafter forward: each one's text is being copied (a LONG_MATCH continuation), its copies have not been
        earning less than its blocks (lookup.Edge) and it does not wait after a refused copy. Such a slot would
        verify the copy anyway (lookup.choose), and its block would only score the edge; but every CHECK_EVERY-th
        such step drafts, so that the edges go on learning."""
        for mine, edge, history, k in drafting:
            self.why = ("wait" if mine.wait else "edge" if edge.value < 0.0 else "history" if history is None
                        else "" if history.continuation(k, LONG_MATCH)[0] else "match")
            if self.why:
                return False
        self.first_steps += 1
        self.why = "copy" if self.first_steps % CHECK_EVERY else "check"
        return self.why == "copy"

    @staticmethod
    def candidate(mine: SlotCopies, history: Optional[History], k_max: int) -> list[int]:
        """The chain a slot would copy (k_max tokens), [] where its text's end does not repeat LONG_MATCH tokens or it
        waits after a refusal."""
        if mine.wait:
            mine.wait -= 1
            return []
        if history is None or k_max <= 0:
            return []
        return history.continuation(k_max, LONG_MATCH)[0]

    def choose(self, n: int, candidates: list[tuple[SlotCopies, int]], features: bool) -> list[int]:
        """K per candidate (its slot's copy state, its draft_max) in a step of n running slots, target features on
        or off; all 0 where copying does not beat plain decoding."""
        c = self.costs
        plain, base = c.plain(n), c.verify(n, n, features)
        if not candidates or plain is None or base is None or plain <= 0.0:
            return [0] * len(candidates)  # nothing measured yet (the first steps of an engine)
        curves = [accept_curve(mine.counts, self.prior, m) for mine, m in candidates]
        maxes = [m for _, m in candidates]
        x = n + sum(maxes)
        cv = max(0.0, (c.verify_floor(n, x, features) - base) / (x - n))
        lam = n / plain
        ks = best_ks(curves, maxes, lam, cv, 0.0)
        extra = sum(ks)
        if extra and self.prior.weight >= TRIAL_EVIDENCE:
            accepted = sum(e[k] for e, k in zip(curves, ks))
            if (n + accepted) / c.verify_floor(n, n + extra, features) < lam * (1.0 + MARGIN):
                ks = [0] * len(candidates)
        for (mine, _), k in zip(candidates, ks):
            if not k:
                relax(mine.counts)
                mine.wait = RECHECK - 1
        if not any(ks):  # a step with no copy: the engine's evidence fades (one step, however many candidates)
            relax(self.prior, RELAX_ENGINE, _START)
        return ks

    @staticmethod
    def fit_shape(base: int, ks: list[int], maxes: list[int], room: int) -> list[int]:
        """ks (copy lengths, 0 for a slot not copying) moved so that base + sum(ks), the step's batch, is a multiple
        of SHAPE_STEP: lengthened where the copying slots' chains (up to maxes) and the batch's room (beyond base)
        allow, each token where a copy is shortest (an earlier position is likelier accepted), else shortened by up
        to MAX_TRIM tokens where it is longest, else left as it is. A slot never starts copying here; one shortened
        to 0 stops."""
        ks = list(ks)
        extra = sum(ks)
        if not extra:
            return ks
        up = -(base + extra) % SHAPE_STEP
        growable = [i for i, k in enumerate(ks) if k]
        if up <= min(room - extra, sum(maxes[i] - ks[i] for i in growable)):
            for _ in range(up):
                i = min((i for i in growable if ks[i] < maxes[i]), key=lambda i: ks[i])
                ks[i] += 1
            return ks
        down = (base + extra) % SHAPE_STEP
        if down > MAX_TRIM:  # a copy's tail is worth more than the graph it would reuse
            return ks
        for _ in range(min(extra, down)):
            i = max(range(len(ks)), key=lambda i: ks[i])
            ks[i] -= 1
        return ks

    def observe(self, mine: SlotCopies, n_drafts: int, n_accepted: int) -> None:
        mine.counts.observe(n_drafts, n_accepted)
        self.prior.observe(n_drafts, n_accepted)


_START = start_counts()
