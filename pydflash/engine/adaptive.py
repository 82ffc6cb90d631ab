"""How many drafts a slot gets this step: the K that maximises expected tokens per second.

    K* = argmax_K (1 + E[accepted | K]) / t(K),  K in {0} + CANDIDATES (up to the slot's draft_max)

- E[accepted | K] = sum_j prod_{i<=j} p_i, from per-position conditional acceptance rates p_i. Each slot keeps
  decayed counts, blended with the engine's counts as a prior (the same drafter/target pair behaves alike across
  requests, so a useless drafter is recognised once, not once per request).
- t(K) is the measured step time: an EMA per K tried (K=0 is a plain step). Untried K are interpolated linearly
  between tried neighbours (extrapolated with the last slope), so the search can move without trying everything.
  On a GPU t(K) is nearly flat and K* is the trained block; on a CPU verify cost grows with K and K* shrinks.
- When K* = 0 the slot decodes plainly and probes, at the best drafting K, after a pause that doubles while probes
  fail (up to MAX_BACKOFF steps), so a useless drafter costs about one probe step in MAX_BACKOFF. New slots start
  from the engine's latest pause length, so a useless drafter is recognised once, not once per request.
- A paused slot needs no target features until FEATURE_LEAD steps before its probe: the engine turns extraction
  off while no slot needs them (a copy per feature layer on every step). The drafter's context then restarts from
  the features collected in the lead-in, which costs no extra target work (see ``Slot``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

CANDIDATES = (1, 2, 3, 4, 6, 8, 11, 15)
EMA = 0.2
DECAY = 0.97  # per observation: old acceptance evidence fades
PRIOR_WEIGHT = 4.0  # engine counts count as this many drafting steps of a slot's own evidence
MIN_BACKOFF = 4
MAX_BACKOFF = 256
# Steps before a probe during which a paused slot collects features again: the probe's drafter context. With the
# shipped drafter, the last 32 positions keep held-out tau at 2.11 / 4.04 (code / prose) against 2.12 / 4.36 with
# the full context; 16 drop prose to 3.37 (scripts/eval_restart_window.py, docs/drafter_restart_window_cpu.json).
FEATURE_LEAD = 32


@dataclass
class AcceptCounts:
    """Decayed per-position counts: drafted[i] and accepted[i] for draft position i+1."""

    drafted: list[float] = field(default_factory=lambda: [0.0] * CANDIDATES[-1])
    accepted: list[float] = field(default_factory=lambda: [0.0] * CANDIDATES[-1])
    weight: float = 0.0  # decayed number of observations
    backoff: int = MIN_BACKOFF  # the latest pause length a slot chose; new slots start from it

    def observe(self, n_drafts: int, n_accepted: int) -> None:
        for i in range(len(self.drafted)):
            self.drafted[i] *= DECAY
            self.accepted[i] *= DECAY
        # position i was tested only if all before it were accepted
        for i in range(min(n_drafts, n_accepted + 1)):
            self.drafted[i] += 1.0
            self.accepted[i] += 1.0 if i < n_accepted else 0.0
        self.weight = self.weight * DECAY + 1.0


def expected_accepted(slot_counts: AcceptCounts, prior: AcceptCounts, k: int) -> float:
    """E[accepted drafts] with k drafts, from conditional rates p_i (slot counts blended with the prior)."""
    w = PRIOR_WEIGHT / max(prior.weight, 1e-9)
    total, run, last_p = 0.0, 1.0, 0.5
    for i in range(k):
        d = slot_counts.drafted[i] + w * prior.drafted[i]
        a = slot_counts.accepted[i] + w * prior.accepted[i]
        # shrink towards the previous position's rate (deep positions are tested rarely); an even prior at 1
        p = (a + last_p) / (d + 1.0)
        last_p = p
        run *= p
        total += run
    return total


@dataclass
class StepCosts:
    """EMA of step seconds per drafts-per-slot K (K=0: plain step).

    The first step at each K is not counted: it includes llama.cpp's graph allocation for that shape (measured on
    an H200: a warm-up step 100x a normal one, which pinned K=15 as "too slow" for good)."""

    seconds: dict = field(default_factory=dict)
    seen: set = field(default_factory=set)

    def observe(self, k: int, seconds: float) -> None:
        if k not in self.seen:
            self.seen.add(k)
            return
        old = self.seconds.get(k)
        self.seconds[k] = seconds if old is None else (1 - EMA) * old + EMA * seconds

    def estimate(self, k: int) -> float | None:
        if k in self.seconds:
            return self.seconds[k]
        known = sorted(self.seconds)
        if not known:
            return None
        lo = [x for x in known if x < k]
        hi = [x for x in known if x > k]
        if lo and hi:  # interpolate
            a, b = lo[-1], hi[0]
            return self.seconds[a] + (self.seconds[b] - self.seconds[a]) * (k - a) / (b - a)
        pts = lo[-2:] if len(lo) >= 2 else hi[:2]
        if len(pts) < 2:  # one point: assume cost grows like a plain step per extra token, at most
            (x,) = pts
            return self.seconds[x] * (1 + k) / (1 + x) if k > x else self.seconds[x]
        (x0, x1) = pts
        slope = (self.seconds[x1] - self.seconds[x0]) / (x1 - x0)
        return max(self.seconds[x1] + slope * (k - x1), 1e-9)


@dataclass
class SlotPolicy:
    counts: AcceptCounts = field(default_factory=AcceptCounts)
    pause: int = 0  # plain steps left before the next probe (0: deciding every step)
    backoff: int = MIN_BACKOFF  # the next pause length


def new_slot_policy(prior: AcceptCounts) -> SlotPolicy:
    return SlotPolicy(backoff=prior.backoff)


def expects_drafting(prior: AcceptCounts) -> bool:
    """Whether a new slot is likely to draft soon: not while the engine's slots keep pausing."""
    return prior.backoff == MIN_BACKOFF


def wants_features(policy: SlotPolicy) -> bool:
    """Whether this slot needs target features this step: unless it is paused for a while yet."""
    return policy.pause <= FEATURE_LEAD


def choose_drafts(policy: SlotPolicy, draft_max: int, prior: AcceptCounts, costs: StepCosts) -> int:
    if draft_max == 0:
        return 0
    cands = [k for k in CANDIDATES if k <= draft_max] or [draft_max]
    # calibrate first: the full block and a plain step, each measured past its warm-up step
    if cands[-1] not in costs.seconds:
        return cands[-1]
    if 0 not in costs.seconds:
        return 0
    if policy.pause > 1:  # paused: no estimate needed until the probe step
        policy.pause -= 1
        return 0
    best_k = _best(policy, cands, prior, costs)
    if policy.pause == 1:
        policy.pause = 0
        # probe with the drafting K that would pay best if the drafter were as good as it last looked
        return max(best_k[1], 1)
    if best_k[0] == 0:
        policy.pause = policy.backoff
        policy.backoff = min(policy.backoff * 2, MAX_BACKOFF)
    else:
        policy.backoff = MIN_BACKOFF
    prior.backoff = policy.backoff
    return best_k[0]


def _best(policy: SlotPolicy, cands: list[int], prior: AcceptCounts, costs: StepCosts) -> tuple[int, int]:
    """(best K including plain decoding, best drafting K) by expected tokens per second."""
    rate0 = 1.0 / costs.seconds[0]
    best, best_rate, best_draft, best_draft_rate = 0, rate0, cands[0], -1.0
    for k in cands:
        rate = (1.0 + expected_accepted(policy.counts, prior, k)) / costs.estimate(k)
        if rate > best_draft_rate:
            best_draft, best_draft_rate = k, rate
        if rate > best_rate:
            best, best_rate = k, rate
    return best, best_draft


def observe(policy: SlotPolicy, prior: AcceptCounts, n_drafts: int, n_accepted: int) -> None:
    if n_drafts:
        policy.counts.observe(n_drafts, n_accepted)
        prior.observe(n_drafts, n_accepted)
