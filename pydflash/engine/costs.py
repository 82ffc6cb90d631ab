"""What a step costs, learned online from the engine's own steps.

A step is one target forward over the verify spans (each running slot's anchor plus its K drafts) and, when any
slot drafts, one drafter forward over the draft blocks (each drafting slot's anchor plus K masks). So

    t(step) = V_f(n, n + sum K) + D(sum over drafting slots of (K + 1))

- V_f(n, x): seconds of the target forward and everything the host does around it, over x verify tokens of n
  running slots, with feature extraction on or off (f): extraction copies every feature layer's rows to the host
  (+10% of a plain step at 8 slots on an H200, docs/benchmarks.md).
- D(x): seconds of the drafter forward (feature injection included) over x block tokens; 0 when nobody drafts.

Neither is linear: on an H200 a verify row is 0.14 ms from 8 to 16 tokens and 0.03 ms from 40 to 128 (the
vocabulary-sized output rows get cheaper per row as the batch grows); on a CPU both grow about linearly. So each
is a curve: per bucket of x, a robust mean of the seconds seen there, interpolated linearly between buckets. Steps
that also carry a prompt chunk are not observed (their cost is not the decode cost of their x), and on a GPU the first
WARMUP steps in each bucket are dropped: the first can include llama.cpp's graph allocation for a new batch shape
(measured on an H200: 100x a normal step), the second ggml-cuda's CUDA-graph capture (it captures a graph on the
second call of a shape). A busy machine stalls steps now and then (another process, the GIL): the first ROBUST_FIRST
samples of a bucket keep their minimum, and later ones move the EMA by at most 2x the current value, so one stall
cannot make a shape look expensive for good.

A cost never falls with more tokens, so a bucket's value also caps every bucket below it. Without that, one slow
sample at a shape the policy never visits again (calibration's 2 drafts, taken while the GPU warmed up) stayed the
floor of every longer shape for good: on the H200 through HTTP, a 4-draft probe's verify was costed at 6.5 ms, five
times what it took, probe after probe, and the shipped drafter never drafted again after its first pause.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from typing import Optional

EMA = 0.2
WARMUP = 2  # samples dropped per bucket where the backend warms up (drop_first: GPU backends)
ROBUST_FIRST = 3
EXACT_UP_TO = 16  # buckets: every x up to here, then geometric
GROWTH = 1.125


def bucket(x: int) -> int:
    if x <= EXACT_UP_TO:
        return x
    return EXACT_UP_TO + 1 + int(math.log(x / EXACT_UP_TO) / math.log(GROWTH))


@dataclass
class Curve:
    """seconds(x): per bucket, the mean x and a robust mean of the seconds observed there (see the module)."""

    drop_first: bool = True  # the first WARMUP steps of each shape may be warm-up (GPU backends)
    points: dict[int, list[float]] = field(default_factory=dict)  # bucket -> [mean x, seconds, samples]
    # x -> warm-up samples dropped. Per exact x, not per bucket: the backend warms up per batch shape, and a bucket
    # holds several (23 and 24 tokens share one). Counted per bucket, a second shape's warm-up steps (3x a
    # steady step, graph allocation and CUDA-graph capture) entered the first one's value (11.1 ms where 9.0 is
    # true), and the slope from it priced a probe's 40 tokens at up to 15.9 ms (11.6 in truth; a Qwen3-4B-shaped
    # target's costs at 8 slots, simulated): the engine paused through most of the run where drafting paid 1.4x.
    seen: dict[int, int] = field(default_factory=dict)
    # a bucket's value caps the buckets below it (the module); off for a curve that mixes slot counts at one x
    # (StepCosts.verify_any: 16 tokens as 16 one-token spans cost more than as one span of 16)
    cap_below: bool = True
    # the points in x order, rebuilt at the first query after an observation: a paused engine observes every step
    # and queries only when it decides (rebuilding on each observation cost ~4 us of a ~1.2 ms H200 step per curve)
    _sorted: tuple[list[float], list[float]] | None = field(default=None)

    def observe(self, x: int, seconds: float, upper_bound: bool = False) -> bool:
        """upper_bound: the sample bounds the steady cost from above (a GPU step whose shape differs from the step
        before, see StepCosts.observe): it may only lower a measured bucket's value, never make one. Returns
        whether the sample counted as a steady one (not a warm-up step, not an upper bound)."""
        b = bucket(x)
        if upper_bound:
            p = self.points.get(b)
            if p is None or seconds >= p[1]:
                return False
        if self.drop_first and self.seen.get(x, 0) < WARMUP:  # a warm-up step for this shape
            self.seen[x] = self.seen.get(x, 0) + 1
            return False
        p = self.points.get(b)
        if p is None:
            p = self.points[b] = [float(x), seconds, 1]
        elif p[2] < ROBUST_FIRST:
            p[0] += (x - p[0]) / (p[2] + 1)
            p[1] = min(p[1], seconds)
            p[2] += 1
        else:
            p[0] += EMA * (x - p[0])
            p[1] += EMA * (min(seconds, 2.0 * p[1]) - p[1])
        if self.cap_below:  # what this many tokens cost, fewer cannot cost more (the module)
            for q in self.points.values():
                if q[0] < p[0] and q[1] > p[1]:
                    q[1] = p[1]
        self._sorted = None
        return not upper_bound

    def _points(self) -> tuple[list[float], list[float]]:
        """(xs, seconds) in x order."""
        if self._sorted is None:
            pts = sorted(self.points.values())
            # a cost never falls with more tokens: noise that says so would make extra drafts look free
            self._sorted = [p[0] for p in pts], list(_running_max([p[1] for p in pts]))
        return self._sorted

    @property
    def known(self) -> bool:
        return bool(self.points)

    def has(self, x: int, samples: int = 1) -> bool:
        """Whether x's bucket has been measured (past its warm-up steps), at least `samples` times."""
        p = self.points.get(bucket(x))
        return p is not None and p[2] >= samples

    def covers(self, x: float) -> bool:
        xs = self._points()[0]
        return bool(xs) and xs[0] <= x <= xs[-1]

    def nearest(self, x: float) -> tuple[float, float]:
        """The known point (x, seconds) closest to x."""
        xs, ts = self._points()
        i = min(range(len(xs)), key=lambda j: abs(xs[j] - x))
        return xs[i], ts[i]

    def floor(self, x: float) -> Optional[float]:
        """The least x can cost by what was measured: the cost at the largest known point at or below x (a cost never
        falls with more tokens), the smallest known cost below every point; None while nothing is known."""
        xs, ts = self._points()
        if not xs:
            return None
        return ts[max(0, bisect.bisect_right(xs, x) - 1)]

    def __call__(self, x: float) -> Optional[float]:
        xs, ts = self._points()
        if not xs:
            return None
        i = bisect.bisect_left(xs, x)
        if i < len(xs) and xs[i] == x:
            return ts[i]
        if i == 0:  # below every known point: the smallest known cost (a step has a large fixed part)
            return ts[0]
        if i == len(xs):  # above: the slope of a wide chord (_top_slope), or with one point a cost proportional to x
            if len(xs) == 1:
                return ts[0] * x / max(xs[0], 1.0)
            return ts[-1] + _top_slope(xs, ts) * (x - xs[-1])
        x0, x1 = xs[i - 1], xs[i]
        return ts[i - 1] + (ts[i] - ts[i - 1]) * (x - x0) / (x1 - x0)


def _top_slope(xs: list[float], ts: list[float]) -> float:
    """The slope to extrapolate above the last point with: the chord to it from the last point at or below half its
    x (else the first point). Two neighbouring buckets (22 and 24 tokens) are measured as often as two far apart,
    and their noise divided by one token made a slope that priced 17 tokens more at 25 ms (8 slots of a
    Qwen3-4B-shaped target, simulated); a chord over half the range divides it by many. On a CPU, where costs grow
    about linearly, it is the same slope; on a GPU, where they are concave, it overrates the next tokens, as before."""
    j = max(bisect.bisect_right(xs, xs[-1] / 2) - 1, 0)
    return (ts[-1] - ts[j]) / max(xs[-1] - xs[j], 1e-9)


def _shape_for(own: Curve, other: Curve, x: float) -> Curve:
    """The curve whose shape prices x: own where it covers x, else other where that does; else the one that has a
    slope to extrapolate with (two points or more), own first. Steps without features are measured at x = n only,
    in pauses, until copies (copies.py) verify more: extrapolated from that one point, a cost proportional to x
    priced each copied token at a whole plain step, where the curve with features (calibration's drafting steps)
    knew a verify token's cost, and no copy was ever tried."""
    if own.covers(x) or not other.known:
        return own
    if other.covers(x) or not own.known:
        return other
    return own if len(own.points) >= 2 or len(other.points) < 2 else other


def _running_max(values):
    m = -math.inf
    for v in values:
        m = max(m, v)
        yield m


@dataclass
class StepCosts:
    """The verify curves per feature state and per number of running slots n, and the drafter's curve.

    V also grows with n at a fixed x: each sequence adds attention work over its own KV (on an H200, ~0.11 ms per
    slot: 16 tokens cost 2.58 ms as one span of 16, 3.34 ms as 8 spans of 2). So each n has its own curve; where it
    has no data near x, the curve over all n (its shape) is shifted to match n's own nearest point (its level)."""

    # On a CPU the first step of a new shape costs what the next ones do, and calibration steps are expensive there
    # (one slot's whole block ~10 plain steps): the engine keeps their first samples (drop_first=False).
    drop_first: bool = True
    verify_by_n: dict = field(default_factory=dict)  # (features, n) -> Curve over x
    verify_any: dict = field(init=False)  # features -> Curve over x
    draft: Curve = field(init=False)

    def __post_init__(self):
        self.verify_any = {f: Curve(self.drop_first, cap_below=False) for f in (True, False)}
        self.draft = Curve(self.drop_first)

    def observe(self, n: int, n_verify: int, features: bool, t_verify: float, n_block: int, t_draft: float,
                upper_bound: bool = False) -> bool:
        """One decode step of n running slots: n_verify target tokens (features on or off) in t_verify seconds,
        n_block drafter block tokens (0: no drafting) in t_draft seconds.

        upper_bound: a step that bounds what such steps cost once they repeat, on a GPU a paused engine's probe.
        ggml-cuda replays a captured CUDA graph only for the shape a context ran last, so a drafting step among
        plain ones runs without one (through HTTP on the H200 a 4-draft probe's verify took ~4 ms, against
        ~1.4 ms run steadily): such a sample may lower a measured cost, never raise or make one.

        Returns whether the step was a steady one for both its shapes (past their warm-up, not an upper bound)."""
        kept = self.verify_by_n.setdefault((features, n), Curve(self.drop_first)).observe(n_verify, t_verify,
                                                                                          upper_bound)
        self.verify_any[features].observe(n_verify, t_verify, upper_bound)
        if n_block:
            kept = self.draft.observe(n_block, t_draft, upper_bound) and kept
        return kept

    def known(self, features: bool) -> bool:
        return self.verify_any[features].known

    def verify(self, n: int, x: float, features: bool) -> Optional[float]:
        """V_f(n, x): n's own curve where it covers x, else the shape of all n levelled on n's nearest point (the
        other feature state's shape where this one's cannot tell, ``_shape_for``)."""
        own = self.verify_by_n.get((features, n))
        if own is not None and own.covers(x):
            return own(x)
        shape = _shape_for(self.verify_any[features], self.verify_any[not features], x)
        if not shape.known:
            return None
        level = own if own is not None and own.known else self.verify_by_n.get((not features, n))
        if level is None or not level.known:
            return shape(x)
        px, pt = level.nearest(x)
        return max(1e-9, pt + shape(x) - shape(px))

    def plain(self, n: int) -> Optional[float]:
        """A plain step of n slots without features: n's own measurement where there is one (at most what a step with
        features costs, the fresher of the two), else the step with features less what features cost at the slot
        count nearest n where both were measured. Steps without features are measured only in pauses, so at a load
        that has not paused yet the step with features stood in for plain decoding, which made it look 7-15 % dearer
        than it is on the H200 through HTTP (features on against off at 4-16 slots, docs/benchmarks.md traces):
        drafting that lost that much looked worth it."""
        on = self.verify(n, n, True)
        off = self.verify_by_n.get((False, n))
        if off is not None and off.has(n):
            return off(n) if on is None else min(off(n), on)
        if on is None:
            return self.verify(n, n, False)
        both = [(abs(m - n), m) for (f, m), c in self.verify_by_n.items()
                if f and c.has(m) and (False, m) in self.verify_by_n and self.verify_by_n[(False, m)].has(m)]
        if not both:
            return on
        m = min(both)[1]
        return on * min(1.0, self.verify_by_n[(False, m)](m) / self.verify_by_n[(True, m)](m))

    def verify_floor(self, n: int, x: float, features: bool) -> Optional[float]:
        """The least V_f(n, x) can be by what was measured: the estimate, or where x lies above every verify size
        measured (either feature state, any n), the estimate at the largest of them, since a cost never falls with
        more tokens and nothing says it rises. Copies (copies.py) price their tokens so: each of their steps is
        measured, so a size they try is known from then on, where an extrapolated price (the last slope of two
        noisy points on a CPU: 4x a copied token's cost) kept them from ever trying."""
        est = self.verify(n, x, features)
        tops = [c._points()[0][-1] for c in self.verify_any.values() if c.known]
        if est is None or not tops or x <= max(tops):
            return est
        return min(est, self.verify(n, max(tops), features))

    def draft_floor(self, x: float) -> Optional[float]:
        """The least D(x) can be by what was measured (``Curve.floor``): at most the estimate, less where that is
        extrapolated above the measured block sizes."""
        est, lo = self.draft(x), self.draft.floor(x)
        return est if lo is None or est is None else min(est, lo)

    def measured(self, n: int, x: int, blocks: int) -> bool:
        """Whether steps of n slots with x verify tokens (features on) and blocks drafter block tokens were measured
        past their warm-up, rather than estimated from other shapes."""
        own = self.verify_by_n.get((True, n))
        return own is not None and own.has(x) and (blocks == 0 or self.draft.has(blocks))

    def verify_chord(self, n: int, x0: float, x1: float) -> float:
        """Seconds per extra verify token (features on) between x0 and x1, >= 0."""
        if x1 <= x0:
            return 0.0
        return max(0.0, (self.verify(n, x1, True) - self.verify(n, x0, True)) / (x1 - x0))

    def draft_chord(self, x0: float, x1: float) -> float:
        if x1 <= x0:
            return 0.0
        return max(0.0, (self.draft(x1) - self.draft(x0)) / (x1 - x0))
