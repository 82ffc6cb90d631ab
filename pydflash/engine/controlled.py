"""The host side of a request whose controls depend on the path (penalties, a grammar): its sequence has no
backend sampler chain in either context, so llama.cpp hands over full logits rows, and this draws the drafts from
the drafter's rows and the committed tokens from the target's.

Every row is transformed given the tokens before it (``controls.py``): the committed history, then the drafts
earlier in the block. A ``Point`` is that state (the penalty window, the grammar state) after some tokens; the
draft path keeps one per block position, so verify row i is judged at the same point draft i + 1 was drawn at:
- greedy (temperature 0): draft i + 1 is the argmax of the drafter's transformed row i; the target's pick at row
  i is the argmax of its transformed row; drafts are accepted while they equal the picks. A grammar is asked
  about the argmax first and masks the whole row only when it refuses the likeliest ``PICK_TOP`` tokens;
- sample-and-match (``sampling_mode="match"``): drafts as greedy; the target's pick is a sample of p_i;
- rejection: draft i + 1 is a sample of q_i (the drafter's transformed row under top-k/top-p/min-p/temperature),
  accepted with probability min(1, p_i(x) / q_i(x)); a rejection commits a sample of norm(max(0, p_i - q_i)),
  and after K acceptances the bonus is a sample of p_K (``rejection.py``). p and q are dense here: a grammar
  masks the whole row (its normalisation needs every allowed token).
Only tokens the grammar allowed are ever committed, so the grammar state only moves through allowed tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np

from ..native.grammar import Grammar
from . import controls, rejection
from .request import Request

PICK_TOP = 256  # tokens asked about at once when the grammar refuses the argmax (``HostSampler._pick``)


@dataclass
class Point:
    """The state a row is transformed in: the penalty window and the grammar state after the tokens so far."""

    window: Optional[controls.Window]
    grammar: Optional[Grammar]

    def then(self, tok: int) -> "Point":
        """The state one token later (copies: this one stays valid for the rows before)."""
        window = grammar = None
        if self.window is not None:
            window = self.window.copy()
            window.push(tok)
        if self.grammar is not None:
            grammar = self.grammar.clone()
            grammar.accept(tok)
        return Point(window, grammar)


Rows = Callable[[int], np.ndarray]  # row i -> a fresh float32 copy of its [V] logits


class HostSampler:
    def __init__(self, req: Request, history: list[int], grammar: Optional[Grammar], eos: int):
        self.req = req
        self.penalties = req.penalties
        self.eos = eos  # committed where the grammar and the bans leave no token at all
        window = controls.Window(history, self.penalties.last_n) if self.penalties.on else None
        self.point = Point(window, grammar)  # after the committed tokens
        self.rng = rejection.seeded_rng(req._seed, 1)  # acceptance uniforms, the target's samples
        self.draft_rng = rejection.seeded_rng(req._seed, 2)  # the drafter's samples (rejection mode)
        self._path: tuple[list[int], list[Point], list[np.ndarray]] = ([], [self.point], [])

    @property
    def sampled_drafts(self) -> bool:
        return self.req.rejection

    # --- one row ----------------------------------------------------------------------------------------
    def _transform(self, z: np.ndarray, at: Point, mask: bool) -> np.ndarray:
        controls.add_bias(z, self.req._bias)
        if at.window is not None:
            self.penalties.apply(z, at.window.counts)
        if mask and at.grammar is not None:
            at.grammar.mask(z)
        return z

    def _pick(self, z: np.ndarray, at: Point) -> Optional[int]:
        """The argmax of the transformed row among the tokens the grammar allows; None: no token is left. The
        grammar is asked about the argmax, then about the next PICK_TOP tokens in one call, and masks the whole
        row only if it refuses all of them (~20 ms over Gemma's 262k tokens on a CPU core)."""
        z = self._transform(z, at, mask=False)
        t = controls.argmax(z)
        if t is None or at.grammar is None or at.grammar.allows(t):
            return t
        top = np.flatnonzero(z > -np.inf)  # (argpartition over a row of many equal -inf was ~20 ms)
        if len(top) > PICK_TOP:
            top = top[np.argpartition(z[top], -PICK_TOP)[-PICK_TOP:]]
        top = top[np.argsort(-z[top], kind="stable")]
        ok = np.flatnonzero(at.grammar.allowed(top.astype(np.int32)))
        if len(ok):
            return int(top[ok[0]])
        at.grammar.mask(z)
        return controls.argmax(z)

    def _dist(self, z: np.ndarray, at: Point) -> Optional[np.ndarray]:
        """p (or q) for one row: [V] float64, or None where no token is left."""
        z = self._transform(z, at, mask=True)
        if not np.isfinite(z).any():
            return None
        r = self.req
        return controls.distribution(z, r.temperature, r.top_k, r.top_p, r.min_p)

    # --- a step -----------------------------------------------------------------------------------------
    def draft(self, rows: Rows, k: int) -> list[int]:
        """Up to k drafts from the drafter's block rows (row i predicts draft i + 1), each drawn at the point the
        drafts before it lead to; fewer where the grammar leaves nothing to draft."""
        drafts, points, qs = [], [self.point], []
        for i in range(k):
            at = points[-1]
            if self.sampled_drafts:
                q = self._dist(rows(i), at)
                d = None if q is None else rejection.sample(q, self.draft_rng.random())
                qs.append(q)
            else:
                d = self._pick(rows(i), at)
            if d is None:
                break
            drafts.append(d)
            points.append(at.then(d))
        self._path = (drafts, points, qs)
        return drafts

    def commit(self, drafts: list[int], rows: Rows) -> tuple[int, list[int]]:
        """Accepted count m and committed tokens from the target's verify rows (row i follows drafts[:i]); the
        committed state moves past them."""
        path, points, qs = self._path
        # the engine verifies the drafts or a prefix of them (the span cut at max_tokens: Engine._trim_to_max_tokens),
        # whose points and q rows are the path's own; anything else (a step without drafting) is walked again
        if path[: len(drafts)] != drafts or not points:
            points = [self.point]
            for d in drafts:
                points.append(points[-1].then(d))
        self._path = ([], [], [])
        r = self.req
        for i in range(len(drafts) + 1):
            z, at = rows(i), points[i]
            if r.temperature == 0.0:
                t = self._pick(z, at)
            else:
                p = self._dist(z, at)
                if p is None:
                    t = None
                elif r.rejection and i < len(drafts):
                    if rejection.accepts(p[drafts[i]], qs[i][drafts[i]], self.rng.random()):
                        continue
                    t = rejection.sample(rejection.residual_weights(p, qs[i]), self.rng.random())
                else:  # the bonus, a match-mode pick, or a step without drafts
                    t = rejection.sample(p, self.rng.random())
            if i < len(drafts) and t == drafts[i]:
                continue
            return i, self._advance(drafts[:i], t, at)
        raise AssertionError("unreachable: the last row always commits")

    def _advance(self, accepted: list[int], t: Optional[int], at: Point) -> list[int]:
        if t is None:  # nothing allowed: end the output (the state does not move past a token it forbids)
            self.point = at
            return accepted + [self.eos]
        self.point = at.then(t)
        return accepted + [t]

    def close(self) -> None:
        self._path = ([], [], [])
        if self.point.grammar is not None:
            self.point.grammar.close()
