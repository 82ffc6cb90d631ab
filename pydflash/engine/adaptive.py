"""Adaptive drafting: how many drafts each slot gets this step, chosen for all slots together.

A slot's K is its number of drafts this step (0: it decodes plainly). E_i(K) is the expected number of its drafts
the target accepts, so a step commits sum_i (1 + E_i(K_i)) tokens. The step's cost is shared
(``pydflash.engine.costs``): every slot's drafts lengthen the one target forward, and the drafter forward and
feature extraction are paid once if anybody drafts. So the K are chosen together, for committed tokens per second
of the whole step:

    maximise  R(K_1..K_n) = (n + sum_i E_i(K_i)) / (V_on(n, n + sum_i K_i) + D(sum_{K_i > 0} (K_i + 1)))
    against   R_plain     = n / V_off(n, n)

R is a ratio, maximised Dinkelbach-style: at a trial rate lam every slot takes, on its own, the K that maximises
E_i(K) - lam * (c_v K + c_d (K + 1)), where c_v and c_d are the cost curves' per-token chords around the current
choice; the true rate of that choice is the next lam. A few rounds settle it. The fixed costs enter through the
final comparison: drafting must beat R_plain by MARGIN, or nobody drafts this step.

- E_i(K) = sum_{j <= K} prod_{i <= j} p_i, from per-position conditional acceptance rates p_i: the slot's decayed
  counts blended with the engine's as a prior (one pair behaves alike across requests, so a useless drafter is
  recognised once, not once per request).
- When nobody should draft, drafting pauses for the whole engine, for a number of steps that doubles while probes
  keep failing (up to MAX_BACKOFF, USELESS_PAUSE for a drafter whose first drafts are almost never accepted, or
  further while a probe at that load costs over PROBE_SHARE of a pause's plain steps), and quadruples when the
  probe had no draft accepted anywhere and the engine's
  evidence says first drafts are almost never accepted; then every slot probes once at its best drafting K, at
  least PROBE_K (a probe of one draft tells nothing about the block's later positions), or only PROBE_SLOTS of them
  while that evidence stands. One shared pause means one probe step per pause at any concurrency: per-slot probes
  at 16 slots put a probe in one step of every 16. Pause lengths are kept per number of running slots (``_at``).
- A request that arrives in an idle engine ends the pause (``alone``), unless the drafter looks useless: it is a new
  text, and the pause was decided on the last one. Such resets become rarer while their probes keep finding nothing
  worth drafting (``reset_chance``), and come at every arrival while enough of them win.
- A slot left out while others draft gathers no evidence; after ``patience`` such decisions (doubling) it probes
  at its best drafting K, which costs little in a step that drafts anyway.
- A drafting decision is kept for REPLAN_EVERY steps while the same slots run: acceptance evidence moves slowly,
  and deciding for 16 slots costs a few percent of a GPU step.
- The first decision, and the one after each probe, may draft although drafting does not look like it pays
  (``_explore``): the probe's K where its cost at this load was never measured (a probe cannot measure it on a GPU)
  and drafting would pay at the least the measurements allow; after a probe, drafting that falls short of the bar
  by less than NEAR / sqrt(n), which renews acceptance evidence that a pause leaves as it was when a dip decided it.
  Neither resets the pause length, and neither happens for a drafter that looks useless.
- Target features are extracted only when needed: in drafting steps and in the FEATURE_LEAD steps before a probe
  (SHORT_LEAD before the probe of a pause of LONG_PAUSE steps or more), where only the probing slots keep them
  (``Plan.keep``). The drafter's context then restarts from those features (see ``Slot``), at no extra target work.
- Realized against modelled: the cost curves keep robust means (a bucket's least early sample, an EMA that a
  spike moves by at most 2x), which is right for the stalls of a busy machine but hides costs that recur only in
  drafting steps. On the H200 through HTTP the shipped drafter at 16 clients drafted at 4 tokens a step and ran at
  0.52x of plain (in one of five rounds; 0.84x in another): its steps took far longer than the curves said. So
  each steady drafting step's measured seconds are set against what the curves predicted for it when it was
  planned: the ratio of their decayed sums at n slots (``overhead_at``, believed in proportion to its evidence,
  taken as >= 1) scales every drafting step's cost at n, and a drafter that the curves flatter stops drafting after
  a few steps. Each probe at n lowers that evidence's weight, so drafting comes back now and then to measure again.
- Calibration: the first decode steps measure a plain step (features kept) and every slot drafting 2; one slot's
  whole block is measured at once on a GPU, on a CPU once the drafts look good enough for it to matter
  (``_calibration``). Steps carrying a prompt chunk are not measured, so calibration lasts until enough pure
  decode steps were seen. On a GPU each of those shapes is measured 3 times past its warm-up steps (the least is
  kept), and a pause's probe teaches the curves only upper bounds (``costs_are_upper_bounds``): ggml-cuda replays
  a CUDA graph only for the shape a context ran last, so a probe among plain steps runs without one.
"""

from __future__ import annotations

import itertools
import logging
import random
from dataclasses import dataclass, field

from .costs import ROBUST_FIRST, WARMUP, StepCosts

log = logging.getLogger(__name__)

CANDIDATES = (1, 2, 3, 4, 6, 8, 11, 15)
DECAY = 0.97  # per observation: old acceptance evidence fades
PRIOR_WEIGHT = 4.0  # engine counts count as this many drafting steps of a slot's own evidence
MARGIN = 0.03  # drafting must promise this much over plain decoding: the estimates are noisy, a loss is not
ROUNDS = 3
REPLAN_EVERY = 4  # steps a drafting decision is kept while the same slots run (a decision at 16 slots ~0.15 ms)
REFRESH_PLAIN = 128  # while drafting, one plain step (features kept) in this many keeps the plain cost current
MIN_BACKOFF = 4
MAX_BACKOFF = 512
# A pause may grow past MAX_BACKOFF until its probe costs at most PROBE_SHARE of the paused engine's time: on the
# H200 through HTTP a probe of every slot took 10-30 ms at 8 slots and 16-52 ms at 16 (a plain step 1.9 / 3.0 ms,
# docs/benchmarks.md), 1-3 % of a 512-step pause, where a useless drafter's whole budget is 3 %. (Half a percent
# made the 8-slot pauses of test_pauses_grow_per_slot_count long enough to cover most of a 1-slot tail that drafts:
# the pause itself is shared across slot counts.)
PROBE_SHARE = 0.01
LONGEST_PAUSE = 4096
# A probe in which no slot's first draft was accepted, from a drafter whose first drafts the engine has (almost)
# never seen accepted, is strong evidence: the next pause grows 4x, not 2x. A useless drafter then reaches
# MAX_BACKOFF after ~340 steps with 4 probes instead of ~1020 with 8, a ramp whose lead-in feature steps cost a
# freshly started server ~3 % of its first thousand steps (through HTTP at 1 client it ran at 0.92x of plain). A
# useful drafter (first drafts accepted ~75 % of the time) that has one unlucky probe keeps doubling.
BLANK_PROBE_GROWTH = 4
BLANK_FIRST_RATE = 0.1  # engine-wide acceptance of first drafts under which a drafter counts as useless
BLANK_EVIDENCE = 3.0  # (decayed) first drafts seen before that rate is trusted
# Pauses of a drafter that counts as useless grow to this instead of MAX_BACKOFF. At MAX_BACKOFF its steady cost was
# a probe and SHORT_LEAD feature steps every 512 steps: on the H200 through HTTP at 1 client a probe took 3-7 ms and
# a lead-in step 0.15 ms more than a plain one (1.1 ms), ~1 % of a useless drafter's 3 % budget (docs/benchmarks.md,
# trace of py-random). A quarter of that here; a drafter that turns useful is found by the next probe, ~2 s later at
# 1 client, instead of ~0.6 s.
USELESS_PAUSE = 2048
# A request alone in an idle engine ends the pause (``DraftPolicy.alone``) for a drafter that is not useless. Each
# such reset costs a probe and its lead-in: on an H100 (2026-12-05, scripts/bench/paused_cost.py --request-tokens 256
# with step traces) a probe at 1 slot took 7.0 ms median against a plain step's 1.33 (a 16-token verify without a
# CUDA graph, the drafter's catch-up over the prompt), and the shipped drafter on the frozen fresh prompts, whose
# resets almost never found drafting to pay, ran at 1.043x a plain step's time in-process and at 0.92x of plain's
# tokens per second through HTTP. So an arrival resets with a chance that follows how often resets have won (their
# probe found drafting worth it): a probe costs ~6 ms over a plain 256-token request's ~340 ms at 1 slot, and a won
# reset drafts the request through, ~2x faster there (the shipped drafter's rounds that drafted ran 2-3x plain):
# resets pay from a win rate of ~3-5 %. At RESET_WIN_RATE or more every arrival resets; under it the chance falls in
# proportion, to no less than RESET_FLOOR (~0.1 % of a request's time on traffic the drafter never suits). Before
# (2026-12-05), each reset that failed halved the chance, down to 1 in 16, and only a win restored it: where 1 text in
# 8 suited the drafter (the fresh set's repetition prompts, some code), most of those texts came while the chance was
# low and ran plain, and rounds at 1 client came out 0.9x-2.6x of plain by luck (H100, 2026-12-06). Replayed on the
# GPU's costs (scripts/bench/reset_replay.py, 4 seeds of 128 requests): where 1 text in 8 suits, 1.19-1.35x of plain
# before, 1.36-1.40x now; 1 in 4 1.57-1.63x -> 1.64-1.71x; texts it never suits 0.98-1.00x either way.
# Drawn, not every k-th arrival: texts that alternate would lock a fixed period onto the wrong ones.
RESET_WIN_RATE = 0.1
RESET_FLOOR = 1 / 16
RESET_DECAY = 0.95  # per judged reset: the win rate follows the last ~20 resets
RESET_PRIOR = 0.1  # pseudo-counts of a win in two tries: the first resets come at every arrival, and with no win the
# chance falls as 1 / (failures + 0.2), to RESET_FLOOR where the decayed tries level off (~20)
PROBE_K = 4  # the least a probe drafts (where draft_max allows): enough positions to see whether a block pays
# After a probe, drafting whose estimated rate falls short of the bar (plain decoding + MARGIN) by less than NEAR /
# sqrt(n) at n slots is tried for one decision (``_explore``). A pause is decided when the noisy acceptance estimate
# dips, and that estimate then stands through the pause (a probe adds one observation a slot), so a drafter that
# paid ~15 % at 1 slot stopped at the first dip of its text and seldom drafted again (simulated with the H200's
# through-HTTP costs, prose-like text of tau 2.7 at 1 slot: drafting in 37 % of its steps, 1.09x of plain; with the
# trial 1.14x, drafting in every step 1.18x). The step's total acceptance is less noisy with more slots: at 4-16
# slots a wider band tried drafting that lost (mixed texts, simulated: 0.92x of plain where pausing gave 0.96x).
NEAR = 0.1
# While the engine's evidence says first drafts are (almost) never accepted (BLANK_FIRST_RATE), a pause's probe
# drafts on at most this many slots, those probed least so far (each request in turn), and only they keep target
# features in its lead-in. On the H200 through HTTP a probe of every slot cost 16-52 ms at 16 slots against a 2.9 ms
# plain step, and a lead-in step ~0.3 ms more than a plain one, all of it the host copying every slot's feature
# rows: a useless drafter's probes and lead-ins took 1.2-1.6 % of decode time at 4-16 slots (docs/benchmarks.md),
# half of its 3 % budget. Two slots' blocks tell a useless drafter as well as sixteen. A drafter with some evidence
# of use probes on every slot: the deeper positions a wide probe samples are what brings a modest drafter back to
# drafting (p 0.75 at 8 slots, simulated: 1.15x of plain with wide probes, never drafting again with two-slot ones).
PROBE_SLOTS = 2
# Steps before a probe during which a paused slot collects features again: the probe's drafter context. With the
# shipped drafter, the last 32 positions keep held-out tau at 2.11 / 4.04 (code / prose) against 2.12 / 4.36 with
# the full context; 16 drop prose to 3.37 (a CPU replay of the held-out prompts, docs/benchmarks.md).
FEATURE_LEAD = 32
# Once probes have failed up to pauses this long, the drafter is as good as useless here: a shorter lead-in (the probe
# then underrates a drafter a little, which only matters for one that barely pays) keeps the steady cost of a useless
# drafter at 16 feature steps + 1 probe in 512 steps instead of 32 in 256 (the budget: >= 0.97x of plain at any load).
LONG_PAUSE = 256
SHORT_LEAD = 16
# A pause's plain steps without features teach the plain cost only one in this many: they all cost alike, and
# observing one costs ~20 us of Python, ~2 % of an H200 step of the 270M target (a useless drafter's whole budget
# against plain decoding is 3 %)
PAUSED_SAMPLE_EVERY = 8
# realized against modelled (the module): sums of measured and predicted seconds of steady drafting steps, decayed
OVERHEAD_DECAY = 0.95  # per step at the same n: the ratio follows the last ~20 drafting steps
OVERHEAD_MAX = 4.0  # one step counts at most this many times its prediction (a stall for another reason)
WARMUP_MAX = 2.0  # the same for one of the first WARMUP runs of its exact shape (observe_step)
OVERHEAD_FORGET = 0.8  # a probe at n keeps this share of the sums' weight: the ratio stands, its belief fades
OVERHEAD_CONFIDENCE = 4.0  # steps of evidence at which half the measured excess is believed (few steps: mostly 1)
OVERHEAD_SHAPES = 4096  # exact step shapes remembered for their warm-up (forgotten all at once past this)


@dataclass
class AcceptCounts:
    """Decayed per-position counts: drafted[i] and accepted[i] for draft position i+1."""

    drafted: list[float] = field(default_factory=lambda: [0.0] * CANDIDATES[-1])
    accepted: list[float] = field(default_factory=lambda: [0.0] * CANDIDATES[-1])
    weight: float = 0.0  # decayed number of observations

    def observe(self, n_drafts: int, n_accepted: int) -> None:
        for i in range(len(self.drafted)):
            self.drafted[i] *= DECAY
            self.accepted[i] *= DECAY
        # position i was tested only if all before it were accepted
        for i in range(min(n_drafts, n_accepted + 1, len(self.drafted))):
            self.drafted[i] += 1.0
            self.accepted[i] += 1.0 if i < n_accepted else 0.0
        self.weight = self.weight * DECAY + 1.0


def accept_curve(slot_counts: AcceptCounts, prior: AcceptCounts, k_max: int) -> list[float]:
    """E[accepted drafts | K] for K = 0 .. k_max, from conditional rates p_i (slot counts blended with the prior)."""
    w = PRIOR_WEIGHT / max(prior.weight, 1e-9)
    out, total, run, last_p = [0.0], 0.0, 1.0, 0.5
    n = len(slot_counts.drafted)
    for i in range(k_max):
        if i < n:
            d = slot_counts.drafted[i] + w * prior.drafted[i]
            a = slot_counts.accepted[i] + w * prior.accepted[i]
            # shrink towards the previous position's rate (deep positions are tested rarely); an even prior at 1
            last_p = (a + last_p) / (d + 1.0)
        run *= last_p
        total += run
        out.append(total)
    return out


_serials = itertools.count()


@dataclass
class SlotPolicy:
    counts: AcceptCounts = field(default_factory=AcceptCounts)
    left_out: int = 0  # drafting steps this slot sat out since it last drafted
    patience: int = MIN_BACKOFF  # how many it sits out before a probe
    probes: int = 0  # pauses' probes it drafted in (PROBE_SLOTS: the least probed go next)
    # tells requests apart for a kept decision (``DraftPolicy.plan``). Not id(): CPython gives a new request's policy
    # the address of the one that just finished, and the new request then inherited that request's plan
    serial: int = field(default_factory=lambda: next(_serials))


@dataclass
class Plan:
    drafts: list[int]  # K per slot, in the order given
    features: bool  # whether the target must extract features this step
    keep: list[bool] | None = None  # per slot, whether it keeps them (None: every slot; a pause's lead-in: probers)


@dataclass
class DraftPolicy:
    costs: StepCosts = field(default_factory=StepCosts)
    prior: AcceptCounts = field(default_factory=AcceptCounts)  # engine-wide acceptance
    pause: int = 0  # plain steps left before every slot probes (0: deciding every step)
    backoff: int = MIN_BACKOFF  # the next pause length (at the slot count last planned for)
    calibrated: int = 0  # 1: plain and short drafts measured; 2: a whole block too
    _last: tuple | None = None  # (slots, K per slot, predicted seconds) of the last drafting decision
    _age: int = 0  # steps it has been used
    _drafting_steps: int = 0  # steps decided outside pauses
    _lead: int = FEATURE_LEAD  # feature steps before the current pause's probe
    _probe_hits: int | None = None  # drafts accepted in the last pause's probe step (None: no probe pending)
    _paused_steps: int = 0  # featureless pause steps seen (samples_costs)
    _probe_step: bool = False  # the step just planned is a pause's probe (costs_are_upper_bounds)
    # n -> [measured, predicted seconds, steps] of steady drafting steps at n slots, decayed (realized against
    # modelled), and how often each exact step shape ran (its first WARMUP runs count only up to WARMUP_MAX)
    overhead: dict = field(default_factory=dict)
    _shapes: dict = field(default_factory=dict)
    _predicted: float | None = None  # the curves' seconds for the drafting step just planned (None: not one)
    _probe_cost: dict = field(default_factory=dict)  # n -> measured seconds of a pause's probe step (a running mean)
    _probe_predicted: float = 0.0  # the curves' seconds for the last probe
    _n: int | None = None  # the slot count ``backoff`` is for (``_at``); the others' stand in _backoffs
    _backoffs: dict = field(default_factory=dict)
    _may_explore: bool = True  # the next decision may explore (``_explore``): the first one, and each after a probe
    reset_wins: float = 0.0  # ``alone`` resets whose probe found drafting worth it, decayed (RESET_DECAY)
    reset_tries: float = 0.0  # ``alone`` resets judged, decayed
    _draws: random.Random = field(default_factory=lambda: random.Random(0))  # which arrivals reset (seeded)
    _reset_pending: bool = False  # the pending probe is a reset's: the decision after it judges the reset

    def plan(self, slots: list[tuple[SlotPolicy, int]]) -> Plan:
        """K for each (slot policy, draft_max) of the running slots, chosen together."""
        n = len(slots)
        maxes = [m for _, m in slots]
        zeros = [0] * n
        self._probe_step, self._predicted = False, None
        if not any(maxes):  # no slot running, or none may draft: nothing to decide (and no slot count to switch to)
            return Plan(zeros, False)
        self._at(n)
        if self.paused_step(n):  # most steps of a paused engine (the engine asks this first, without a Plan)
            return Plan(zeros, False)
        if self.pause > 1:  # a lead-in step: features for the probing slots, nothing else to decide
            self.pause -= 1
            return self._paused(slots, zeros)
        c = self.costs
        calibration = self._calibration(slots, maxes)
        if calibration is not None:
            return calibration
        key = tuple(pol.serial for pol, _ in slots), tuple(maxes)
        self._drafting_steps += 1
        if self._drafting_steps % REFRESH_PLAIN == 0:  # while drafting, plain costs are never measured otherwise
            return Plan(zeros, True)
        if self.pause == 0 and self._last is not None and self._last[0] == key and self._age < REPLAN_EVERY:
            self._age += 1  # the same slots as the last decision, which drafted: keep it for a few steps
            self._predicted = self._last[2]
            return Plan(list(self._last[1]), True)
        curves = [accept_curve(pol.counts, self.prior, m) for pol, m in slots]
        plain = n / c.plain(n)
        ks, probe = self._choose(n, curves, maxes, plain)
        self._last = None
        after_probe = self._probe_hits is not None
        blank_probe, self._probe_hits = self._probe_hits == 0, None
        judged = after_probe and self._reset_pending  # this decision follows a reset's probe
        if after_probe:
            self._reset_pending = False
        if self.pause == 1:  # the probe: the probing slots draft at their best drafting K
            self.pause, self._probe_hits, self._probe_step, self._may_explore = 0, 0, True, True
            self._forget_overhead(n)
            keep = self._keep(slots)
            ks = probe() if keep is None else [k if kept else 0 for k, kept in zip(probe(), keep)]
            for (pol, _), kept in zip(slots, keep or itertools.repeat(True)):
                pol.probes += kept
            v, d, _ = self._drafting_step(n, curves, ks)
            self._probe_predicted = v + d
            return Plan(ks, True, keep)
        explore, self._may_explore = self._may_explore and not any(ks), False
        if explore:
            ks = self._explore(n, curves, maxes, plain, probe, after_probe) or ks
            explore = any(ks)
        if judged:  # won where the reset's probe found drafting worth it
            self.reset_wins = RESET_DECAY * self.reset_wins + (any(ks) and not explore)
            self.reset_tries = RESET_DECAY * self.reset_tries + 1
        if not any(ks):
            if log.isEnabledFor(logging.INFO):  # once per pause: why (what the GPU's cost curves said)
                log.info("%s", self._why_pause(n, curves, probe(), plain))
            self.pause = self.backoff
            self._lead = SHORT_LEAD if self.pause >= LONG_PAUSE else FEATURE_LEAD
            useless = blank_probe and self._first_draft_rate() < BLANK_FIRST_RATE
            self.backoff = min((BLANK_PROBE_GROWTH if useless else 2) * self.backoff, self._longest_pause(n))
            return self._paused(slots, zeros)
        if not explore:  # drafting pays (an exploration only measures: the pauses keep growing)
            self.backoff = MIN_BACKOFF
        probes = None
        for i, (pol, m) in enumerate(slots):
            if ks[i]:
                pol.left_out, pol.patience = 0, MIN_BACKOFF
            elif m:
                pol.left_out += 1
                if pol.left_out >= pol.patience:  # its evidence is stale: draft once to renew it
                    probes = probes or probe()
                    ks[i] = probes[i]
                    pol.left_out, pol.patience = 0, min(2 * pol.patience, MAX_BACKOFF)
        v, d, _ = self._drafting_step(n, curves, ks)
        self._predicted = v + d
        self._last, self._age = (key, ks, self._predicted), 1
        return Plan(list(ks), True)

    @property
    def regular(self) -> bool:
        """Whether the step just planned drafts by a regular decision: not a probe, a calibration or a refresh of the
        plain cost, which are there to measure."""
        return self._predicted is not None

    def blocks_replaced(self) -> None:
        """The regular step just planned drafts nothing after all (copies.CopyPolicy.first): its measured time is
        not a drafting step's, so it teaches no overhead."""
        self._predicted = None

    def paused_step(self, n: int) -> bool:
        """Whether the step about to be planned for n running slots (some of which may draft) is a plain step of a
        pause outside its lead-in: then it is counted here and there is nothing to plan (no drafts, no features).
        ``plan`` takes this branch first; the engine asks it before building plan's arguments: most steps of a
        paused engine are these, and a useless drafter's whole budget against plain decoding is 3 %."""
        if n != self._n or self.pause <= self._lead + 1:
            return False
        self.pause -= 1
        self._probe_step, self._predicted = False, None
        return True

    def _paused(self, slots: list[tuple[SlotPolicy, int]], zeros: list[int]) -> Plan:
        """A plain step of a pause: features only in the lead-in to its probe, and only for the probing slots."""
        if self.pause > self._lead:
            return Plan(zeros, False)
        return Plan(zeros, True, self._keep(slots))

    def _keep(self, slots: list[tuple[SlotPolicy, int]]) -> list[bool] | None:
        """Which slots the pending probe drafts on (and so keep features in its lead-in), None: all. For a drafter
        that looks useless, PROBE_SLOTS of those that may draft, the least probed first (the same ones through a
        lead-in, unless a request that was never probed arrives in it)."""
        if self._first_draft_rate() >= BLANK_FIRST_RATE:
            return None
        order = sorted((i for i, (_, m) in enumerate(slots) if m), key=lambda i: slots[i][0].probes)
        chosen = set(order[:PROBE_SLOTS])
        return [i in chosen for i in range(len(slots))]

    def _at(self, n: int) -> None:
        """Pauses grow per number of running slots: whether drafting pays depends on it (a verify token costs more
        at more slots), and with one backoff for all, a few drafting steps at 1-2 slots (a round's tail, where the
        shipped drafter pays) sent the 4-16 slot load back to pauses of MIN_BACKOFF steps, each with its lead-in of
        feature steps and its probe. (On the H200 40 % of the paused plain steps at 4 slots extracted features,
        against ~3 % in a steady pause.) A slot count not seen yet starts where the largest one below it stands:
        what does not pay at fewer slots does not at more."""
        if n == self._n:
            return
        if self._n is not None:
            self._backoffs[self._n] = self.backoff
            self.backoff = self._backoff_at(n)
        self._n = n

    def _backoff_at(self, n: int) -> int:
        """The backoff at n running slots (``_at``), without switching to n."""
        if self._n is None or n == self._n:
            return self.backoff
        known = {**self._backoffs, self._n: self.backoff}
        return known.get(n) or max((b for m, b in known.items() if m < n), default=MIN_BACKOFF)

    def samples_costs(self) -> bool:
        """Whether the step just planned should teach the cost curves: every step but a pause's featureless plain
        ones, of which one in PAUSED_SAMPLE_EVERY."""
        if self.pause <= self._lead:  # deciding, drafting, or a lead-in step (features on)
            return True
        self._paused_steps += 1
        return self._paused_steps % PAUSED_SAMPLE_EVERY == 0

    def observe_step(self, n: int, seconds: float, steady: bool, shape: tuple = ()) -> None:
        """The measured seconds of the step just planned (all of it: both forwards and the host work around them).
        A steady drafting step (no catch-up injection, not a probe) teaches ``overhead[n]``; a probe its cost, which
        bounds how long pauses grow (``_longest_pause``)."""
        if self._probe_step:  # a stall counts at most OVERHEAD_MAX x the curves' figure, like a drafting step's
            seconds_seen = min(seconds, OVERHEAD_MAX * self._probe_predicted)
            last = self._probe_cost.get(n)
            self._probe_cost[n] = seconds_seen if last is None else 0.5 * (last + seconds_seen)
        if self._predicted is None or not steady or self._predicted <= 0.0:
            return
        if len(self._shapes) > OVERHEAD_SHAPES:
            self._shapes.clear()
        runs = self._shapes[shape] = self._shapes.get(shape, 0) + 1
        # a warm-up run counts, but at most WARMUP_MAX x its prediction: its one-off cost (a graph allocation,
        # 100x a step) is not drafting's, yet a policy whose shapes keep changing pays some of it every step
        cap = WARMUP_MAX if self.costs.drop_first and runs <= WARMUP else OVERHEAD_MAX
        sums = self.overhead.setdefault(n, [0.0, 0.0, 0.0])
        sums[0] = OVERHEAD_DECAY * sums[0] + min(seconds, cap * self._predicted)
        sums[1] = OVERHEAD_DECAY * sums[1] + self._predicted
        sums[2] = OVERHEAD_DECAY * sums[2] + 1.0

    def _longest_pause(self, n: int) -> int:
        """MAX_BACKOFF (USELESS_PAUSE for a drafter that counts as useless), or longer where probes at n cost so
        much more than a plain step that one in that many steps would take over PROBE_SHARE of a paused engine's
        time (at most LONGEST_PAUSE)."""
        base = USELESS_PAUSE if self._first_draft_rate() < BLANK_FIRST_RATE else MAX_BACKOFF
        probe, plain = self._probe_cost.get(n), self.costs.verify(n, n, features=False)
        if probe is None or plain <= 0.0:
            return base
        return int(min(LONGEST_PAUSE, max(base, (probe - plain) / (PROBE_SHARE * plain))))

    def overhead_at(self, n: int) -> float:
        """What drafting steps at n slots cost over the curves' prediction: a ratio of sums (the mean cost is what
        throughput pays, spikes included), believed in proportion to its evidence (a step or two of it barely
        count, and each probe keeps OVERHEAD_FORGET of it, so that drafting resumes now and then to measure
        again). Never taken as less
        than 1: curves that overrate drafting only make it pause, which costs little (unlike the opposite)."""
        sums = self.overhead.get(n)
        if sums is None or sums[1] <= 0.0:
            return 1.0
        excess = sums[0] / sums[1] - 1.0
        return 1.0 + max(0.0, excess) * sums[2] / (sums[2] + OVERHEAD_CONFIDENCE)

    @property
    def predicted(self) -> float | None:
        """The curves' seconds for the drafting step just planned, overhead not applied (None: not one)."""
        return self._predicted

    def _forget_overhead(self, n: int) -> None:
        sums = self.overhead.get(n)
        if sums is not None:
            for i in range(3):
                sums[i] *= OVERHEAD_FORGET

    def costs_are_upper_bounds(self) -> bool:
        """Whether the step just planned teaches the cost curves only upper bounds (StepCosts.observe): a pause's
        probe on a GPU, where a step of another shape than the one before runs without a CUDA graph."""
        return self._probe_step and self.costs.drop_first

    def _calibration(self, slots: list[tuple[SlotPolicy, int]], maxes: list[int]) -> Plan | None:
        """The first decode steps measure a plain step (with features) and every slot drafting 2 (past each one's
        warm-up steps on a GPU). One slot's whole block is measured too: at once on a GPU; on a CPU only once some
        slot's drafts look good enough for a long block to matter (2 drafts expected to yield >= 1 accepted), since
        there that step costs ~10 plain steps, which a useless drafter should never pay."""
        c, n = self.costs, len(maxes)
        if self.calibrated == 2:
            return None
        # on a GPU, the minimum of ROBUST_FIRST kept samples per shape: a server's first steps past the warm-up ones
        # still ran slow on the H200 (a 2-draft verify costed at 24 ms), and a calibrated shape that no later step
        # visits keeps its value: the whole block's, through the running maximum, made every draft look dear
        need = ROBUST_FIRST if c.drop_first else 1
        if self.calibrated == 0:
            # the plain step keeps features on: a step without them would leave every running slot a feature gap,
            # and the drafting steps right after would draft from an empty drafter context, the first evidence the
            # engine-wide prior gets (a good drafter then looked useless from its first step on the H200). Plain
            # steps without features are measured in the pauses.
            if not c.verify_any[True].has(n, need):
                return Plan([0] * n, True)
            small = [min(2, m) for m in maxes]
            if not (c.verify_any[True].has(n + sum(small), need) and c.draft.has(sum(k + 1 for k in small if k), need)):
                return Plan(small, True)
            self.calibrated = 1
        if max(maxes) <= 2 or c.draft.has(max(maxes) + 1, need):
            self.calibrated = 2
            return None
        e2 = [accept_curve(pol.counts, self.prior, 2)[2] if m > 2 else -1.0 for pol, m in slots]
        j = max(range(n), key=e2.__getitem__)
        # On a GPU (first samples dropped) the block is measured whatever the drafts look like: two steps of a few
        # plain ones, once per engine. Unmeasured, the drafter's cost beyond a 3-token block is extrapolated as
        # proportional to its tokens (right on a CPU), ~5x the H200's at 16 tokens, and its verify as flat: every
        # long draft then looks too dear, and a pause's probes only ever measure short ones.
        if e2[j] < 1.0 and not c.drop_first:
            return None  # not yet: decide with what is known, and look again next time
        return Plan([maxes[j] if k == j else 0 for k in range(n)], True)

    def observe(self, slot: SlotPolicy, n_drafts: int, n_accepted: int) -> None:
        if self._probe_hits is not None:
            self._probe_hits += n_accepted
        if n_drafts:
            slot.counts.observe(n_drafts, n_accepted)
            self.prior.observe(n_drafts, n_accepted)

    def _first_draft_rate(self) -> float:
        """Engine-wide acceptance of first drafts; 1 while too few were seen to tell."""
        drafted = self.prior.drafted[0]
        return self.prior.accepted[0] / drafted if drafted >= BLANK_EVIDENCE else 1.0

    def expects_drafting(self, n: int | None = None) -> bool:
        """Whether a new slot is likely to draft soon, with n slots in the engine (None: as many as last planned
        for): not while drafting keeps pausing at that load, unless a probe is near."""
        backoff = self.backoff if n is None else self._backoff_at(n)
        return backoff == MIN_BACKOFF or 0 < self.pause <= self._lead

    def alone(self, n: int = 1) -> None:
        """n requests arrive in an idle engine: new texts, while the pause was decided on others'. At 1 client on
        the H200 the shipped drafter's requests that began inside a pause left by an undraftable one sat through it
        (drafting in 0-4 % of their steps) where those that began outside one drafted in 90 % or more of theirs when
        their text suited the drafter (docs/benchmarks.md). Unless the drafter looks useless, the pause ends
        with the prompt: its prefill keeps features (``expects_drafting``) and the probe follows the first decode
        step. A useless drafter keeps its pause (a probe per request would cost it ~1 % at 1 slot). Simulated with
        the H200's costs at 1 slot, 60 requests of 256 tokens whose texts alternate two that draft well and two that
        do not: 1.30 -> 1.33x of plain (acceptance 0.85 / 0.05), 1.19-1.22 -> 1.25-1.26x (0.8 / 0.3), 1.14 -> 1.12-1.13x
        where both draft modestly (0.7 / 0.2).

        A burst of n > 1 keeps a pause that probes at n slots have grown to LONG_PAUSE or more: there what decided it
        was the cost of drafting for n slots, which new texts do not change. At 8 clients through HTTP on the H200
        each round began in an idle engine, and its eight prompts went through with features and a probe of all
        eight followed, for a drafter that paused through 99 % of its 8-slot steps: its prefill steps took 0.67 s
        against plain decoding's 0.33 (docs/benchmarks.md).

        An arrival resets with ``reset_chance``: on traffic the drafter does not suit, a probe per request was most
        of what it cost against plain decoding at 1 client."""
        if n > 1 and self._backoff_at(n) >= LONG_PAUSE:
            return
        if self.pause > 2 and self._first_draft_rate() >= BLANK_FIRST_RATE:
            if self._draws.random() >= self.reset_chance():
                return  # resets have seldom won: not at this arrival
            self.pause, self._reset_pending = 2, True

    def reset_chance(self) -> float:
        """The chance that an arrival in a pause resets it: every arrival while resets win at RESET_WIN_RATE or
        more (their decayed win rate, from RESET_PRIOR), less in proportion under it, at least RESET_FLOOR."""
        rate = (self.reset_wins + RESET_PRIOR) / (self.reset_tries + 2 * RESET_PRIOR)
        return min(1.0, max(RESET_FLOOR, rate / RESET_WIN_RATE))

    # --- the joint choice ---------------------------------------------------------------------------------------
    def _choose(self, n: int, curves: list[list[float]], maxes: list[int], plain: float):
        """(K per slot, all 0 when drafting does not beat plain decoding by MARGIN; a function giving each slot's
        best K >= 1 at the plain rate, for probes)."""
        ks = list(maxes)  # the chords start from everybody drafting the whole block
        lam = plain
        best, best_rate = [0] * n, plain * (1.0 + MARGIN)
        f = self.overhead_at(n)  # a drafting step's realized cost over the curves' (the module)
        cv0, cd0 = self._chords(n, ks)
        for i in range(ROUNDS):
            cv, cd = (cv0, cd0) if i == 0 else self._chords(n, ks)
            ks = best_ks(curves, maxes, lam, f * cv, f * cd)
            if not any(ks):
                break
            rate = self._rate(n, curves, ks)
            if rate <= best_rate:
                break
            best, best_rate, lam = ks, rate, rate
        for ks in self._uniform(maxes, best):
            rate = self._rate(n, curves, ks)
            if rate > best_rate:
                best, best_rate = ks, rate
        top, top_rate = self._top_slots(n, curves, maxes, best)
        if top_rate > best_rate:
            best, best_rate = top, top_rate
        return list(best), lambda: best_ks(curves, maxes, plain, cv0, cd0, min_k=PROBE_K)

    def _top_slots(self, n: int, curves: list[list[float]], maxes: list[int],
                   chosen: list[int]) -> tuple[list[int], float]:
        """The best plan in which only the m slots likeliest to have their drafts accepted draft, all at one K (the
        largest the chords chose, or the whole block), for m short of every slot that may draft (``_uniform`` has
        that one), priced on the curves, and its rate (0.0: none). Texts differ: with half the requests on text the
        drafter suits (each draft accepted with p 0.95) and half not (0.3), drafting for the suited slots alone pays
        ~2x on the H200's costs, while the chords, which start from every slot drafting the whole block, price each
        draft at the steep end of the curves, and the uniform plans put every slot's block into the verify. Replayed
        with requests of 128 tokens coming and going (tests/engine/test_adaptive.py, ``replay_requests``; 30 seeds,
        scripts/bench/policy_replay.py), these plans raised the mean over plain from 1.05 to 1.08x at 8 slots and
        1.13 to 1.15x at 16, the worst seed at 16 from 1.00 to 1.06x; where every text has p 0.8 the mean at 8 slots
        fell from 1.37 to 1.34x."""
        best, best_rate = [], 0.0
        eligible = [i for i, m in enumerate(maxes) if m]
        for k in {max(chosen), max(maxes)} - {0}:
            order = sorted(eligible, key=lambda i: -curves[i][min(k, maxes[i])])
            ks, last, falls = [0] * len(maxes), 0.0, 0
            for i in order[:-1]:
                ks[i] = min(k, maxes[i])
                rate = self._rate(n, curves, ks)
                if rate > best_rate:
                    best_rate, best = rate, list(ks)
                # each slot added is less likely to have its drafts accepted than the last: once the rate has
                # fallen three times running it does not come back (at 16 slots where drafting loses, a decision
                # took 0.076 ms with every m priced, 0.041 so; 0.18 ms where it pays)
                falls, last = (falls + 1 if rate < last else 0), rate
                if falls == 3:
                    break
        return best, best_rate

    @staticmethod
    def _uniform(maxes: list[int], chosen: list[int]):
        """Plans in which the drafting slots all take one K (each capped by its draft_max), the largest K the chords
        chose or the whole block, for every slot that may draft and for those the chords chose. The chords price a
        draft by a straight line through the curves around the current choice, while a GPU's verify is concave in
        its tokens (a Qwen3-4B-shaped target on an H100: 1 token 3.2 ms, 4 tokens 4.6, 8 tokens 6.5, 16 tokens
        6.4), so they overrate what shorter blocks save; these plans are priced on the curves themselves. Pricing
        every K so chased each bucket's noise from one K to the next, each new step shape paying its warm-up: in
        test_drafting_steps_dearer_than_the_curves_say_stop a drafter of p 0.95 at one slot ran at 1.48x of plain
        against 1.65x."""
        for group in (maxes, chosen):
            if any(group):
                for k in {max(chosen), max(maxes)} - {0}:
                    yield [min(k, m) if g else 0 for g, m in zip(group, maxes)]

    def _why_pause(self, n: int, curves: list[list[float]], ks: list[int], plain: float) -> str:
        """One line on a pause decision: plain decoding's rate against that of each slot's best drafting K, with
        the costs and expected acceptance behind it."""
        v, d, accepted = self._drafting_step(n, curves, ks)
        f = self.overhead_at(n)
        return (f"drafting pauses {self.backoff} steps at {n} slot{'s' if n != 1 else ''}: plain {plain:.0f} tok/s "
                f"(V {1e3 * n / plain:.3f} ms) against {(n + accepted) / (f * (v + d)):.0f} tok/s drafting K={ks} "
                f"(V {1e3 * v:.3f} ms + D {1e3 * d:.3f} ms, x{f:.2f} realized, for {accepted:.2f} accepted drafts); "
                f"first-draft rate {self._first_draft_rate():.2f}")

    def _chords(self, n: int, ks: list[int]) -> tuple[float, float]:
        """Seconds per extra verify token and per extra drafter block token, around the choice ks."""
        c = self.costs
        return c.verify_chord(n, n, n + sum(ks)), c.draft_chord(2, sum(k + 1 for k in ks if k))

    def _drafting_step(self, n: int, curves: list[list[float]], ks: list[int],
                       floor: bool = False) -> tuple[float, float, float]:
        """A step drafting ks: its verify and drafter seconds (features on) and its expected accepted drafts; floor:
        the drafter's seconds at the least its measurements allow (StepCosts.draft_floor)."""
        c = self.costs
        blocks = sum(k + 1 for k in ks if k)
        d = (c.draft_floor(blocks) if floor else c.draft(blocks)) if blocks else 0.0
        return c.verify(n, n + sum(ks), features=True), d, sum(e[k] for e, k in zip(curves, ks))

    def _rate(self, n: int, curves: list[list[float]], ks: list[int], floor: bool = False) -> float:
        v, d, accepted = self._drafting_step(n, curves, ks, floor)
        return (n + accepted) / (self.overhead_at(n) * (v + d))

    def _explore(self, n: int, curves: list[list[float]], maxes: list[int], plain: float, probe,
                 after_probe: bool) -> list[int] | None:
        """K per slot to draft for one decision although drafting does not look like it pays, or None; only at the
        first decision and right after a probe, and never for a drafter that looks useless (its 3 % budget).

        - The probe's K, where what it costs at this load was never measured and drafting would pay were its
          drafter forward to cost no more than the largest block measured: a probe cannot measure it (on a GPU it
          teaches only upper bounds, ``costs_are_upper_bounds``), so without this an estimate that is too high
          never changes. The drafter's curve is over block tokens whatever the number of drafting slots, while on
          the H200 through HTTP a drafting step's drafter work grows with that number as much as with the tokens
          (1.58 ms at 4 slots drafting ~7 each as at 4 drafting 15, 0.91 ms for one slot's 15, docs/benchmarks.md
          traces). Calibrated at 8 slots, the curve's last slope (8 slots' blocks of 3 against one slot's of 16)
          priced 8 slots drafting 4 at 3.2 ms for 1.4 in tests/engine/test_adaptive.py's LoadMachine, and every pause's
          probe of that shape failed: paused through 99.7 % of the steps where drafting gave 1.56x.
        - After a probe, drafting that falls short of the bar by less than NEAR / sqrt(n) (the module)."""
        if self._first_draft_rate() < BLANK_FIRST_RATE:
            return None
        ks = probe()
        blocks = sum(k + 1 for k in ks if k)
        if (any(ks) and not self.costs.measured(n, n + sum(ks), blocks)
                and self._rate(n, curves, ks, floor=True) >= plain * (1.0 + MARGIN)):
            return ks
        if after_probe:
            ks, _ = self._choose(n, curves, maxes, plain * (1.0 - NEAR / n**0.5))
            if any(ks):
                return ks
        return None


def best_ks(curves: list[list[float]], maxes: list[int], lam: float, cv: float, cd: float,
             min_k: int = 0) -> list[int]:
    """Per slot, argmax_K E(K) - lam * (cv K + cd (K + 1)) over K in {0} and CANDIDATES up to its draft_max (0 when
    that is 0); with min_k, only K >= min(min_k, draft_max)."""
    penalties = {}  # draft_max -> (candidate Ks, their cost in tokens at rate lam)
    out = []
    for curve, m in zip(curves, maxes):
        if m == 0:
            out.append(0)
            continue
        if m not in penalties:
            cands = [k for k in CANDIDATES if min(min_k, m) <= k < m] + [m]
            penalties[m] = cands, [lam * (cv * k + cd * (k + 1)) for k in cands]
        cands, costs = penalties[m]
        best, best_v = 0, 0.0 if min_k == 0 else float("-inf")
        for k, cost in zip(cands, costs):
            v = curve[k] - cost
            if v > best_v:
                best, best_v = k, v
        out.append(best)
    return out
