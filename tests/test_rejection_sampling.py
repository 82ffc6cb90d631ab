"""Rejection sampling over a draft block keeps the target's distribution (issue 15).

- the pure function (``engine/rejection.py``): the marginal of the committed first token is p, by exact
  enumeration of the identity and by a Monte Carlo of the whole step (including q = 0 outside a reduced head);
- the engine on a tiny pair: the first 3 generated tokens with speculation follow plain sampling (chi-square),
  at temperature 0.7 and 1.0 with top-k and top-p, in both modes;
- temperature 0 is the greedy path whatever the mode; the CLI's --temp and --sampling-mode;
- the shipped Gemma pair at temperature 0.7: rejection accepts at least as much as sample-and-match.
"""

from __future__ import annotations

import random
from collections import Counter

import numpy as np
import pytest

from pydflash.engine import rejection as R

# --- the pure function ------------------------------------------------------------------------------------


def _rand_dist(rng: np.random.Generator, v: int, support=None) -> np.ndarray:
    x = rng.random(v) ** 3  # uneven, like a tempered softmax
    if support is not None:
        mask = np.zeros(v, bool)
        mask[list(support)] = True
        x[~mask] = 0.0
    return x / x.sum()


def test_identity_first_token_marginal_is_p():
    """sum_x q(x)[min(1, p/q) 1{x=t} + (1 - min(1, p/q)) r(t)] == p(t), for random p, q; q = 0 outside a reduced
    head and p = 0 outside a top-k set included."""
    rng = np.random.default_rng(0)
    for trial in range(200):
        v = int(rng.integers(2, 12))
        q_support = rng.choice(v, size=int(rng.integers(1, v + 1)), replace=False) if trial % 2 else None
        p_support = rng.choice(v, size=int(rng.integers(1, v + 1)), replace=False) if trial % 3 == 0 else None
        p, q = _rand_dist(rng, v, p_support), _rand_dist(rng, v, q_support)
        np.testing.assert_allclose(R.first_token_marginal(p, q), p, atol=1e-12)
    # disjoint supports: every draft is rejected and the residual is p itself
    p, q = np.array([0.5, 0.5, 0, 0]), np.array([0, 0, 0.3, 0.7])
    np.testing.assert_allclose(R.residual(p, q), p)
    # p == q: nothing to recover from; the fallback is p
    np.testing.assert_allclose(R.residual(p, p), p)


def test_rows_and_sample():
    row = (np.array([7, 3, 5], dtype=np.int32), np.array([0.6, 0.4, 0.0], dtype=np.float32))  # top-p layout
    assert R.prob_of(row, 7) == pytest.approx(0.6) and R.prob_of(row, 5) == 0.0 and R.prob_of(row, 4) == 0.0
    np.testing.assert_allclose(R.dense(row, 9), [0, 0, 0, 0.4, 0, 0, 0, 0.6, 0], atol=1e-7)
    ident = (None, np.array([0.25, 0.75], dtype=np.float32))
    assert R.prob_of(ident, 1) == 0.75 and R.prob_of(ident, 2) == 0.0
    probs = np.array([0.0, 0.5, 0.0, 0.5])
    assert [R.sample(probs, u) for u in (0.0, 0.49, 0.5, 0.999999999)] == [1, 1, 3, 3]
    assert R.sample(np.array([0.3, 0.7, 0.0]), 1.0 - 1e-17) == 1  # never a zero-probability index
    assert R.accepts(0.2, 0.1, 0.99) and not R.accepts(0.0, 0.1, 0.0) and not R.accepts(0.5, 0.0, 0.0)
    assert R.prob_of(None, 3) is None


def _simulate(p_next, q_next, k: int, n_tokens: int, rng: random.Random, unreadable: bool
              ) -> tuple[tuple, int, int]:
    """Generate n_tokens with speculative_commit over a toy model: p_next(prefix) and q_next(prefix) give the
    target's and drafter's next-token distributions. Returns (tokens, drafted, accepted)."""
    out: list[int] = []
    drafted = accepted = 0
    while len(out) < n_tokens:
        drafts, ctx = [], list(out)
        for _ in range(k):  # the drafter samples each draft from q given the drafts before it
            x = R.sample(q_next(tuple(ctx)), rng.random())
            drafts.append(x)
            ctx.append(x)
        ps = [p_next(tuple(out + drafts[:i])) for i in range(k + 1)]
        qs = [q_next(tuple(out + drafts[:i])) for i in range(k)]
        picks = [R.sample(ps[i], rng.random()) for i in range(k + 1)]  # the target chain's own samples
        # an unreadable row (None) finishes the block as sample-and-match
        p_of = lambda i: None if unreadable and rng.random() < 0.2 else ps[i][drafts[i]]  # noqa: E731
        m, committed = R.speculative_commit(
            drafts, picks, p_of, lambda i: qs[i][drafts[i]], lambda i: (ps[i], qs[i]), rng)
        drafted, accepted = drafted + k, accepted + m
        out += committed
    return tuple(out[:n_tokens]), drafted, accepted


@pytest.mark.parametrize("reduced_head,unreadable", [(False, False), (True, False), (False, True)])
def test_monte_carlo_joint_of_two_tokens_is_p(reduced_head, unreadable):
    """The whole step (draft sampling, acceptance uniforms, residual, bonus) over a toy 4-token model whose
    distributions depend on the prefix: the joint of the first two committed tokens is p(t1) p(t2 | t1)."""
    v, rng_np = 4, np.random.default_rng(1)
    head = [0, 1] if reduced_head else None  # q = 0 outside the drafter's head
    # a Markov chain of order 1: the next-token distributions depend on the last token
    table_p = {(): _rand_dist(rng_np, v), **{(a,): _rand_dist(rng_np, v) for a in range(v)}}
    table_q = {(): _rand_dist(rng_np, v, head), **{(a,): _rand_dist(rng_np, v, head) for a in range(v)}}
    exact = {(a, b): table_p[()][a] * table_p[(a,)][b] for a in range(v) for b in range(v)}
    n, rng = 20000, random.Random(5)
    counts, drafted, accepted = Counter(), 0, 0
    for _ in range(n):
        toks, d, a = _simulate(lambda c: table_p[c[-1:]], lambda c: table_q[c[-1:]], 2, 2, rng, unreadable)
        counts[toks] += 1
        drafted, accepted = drafted + d, accepted + a
    assert accepted > 0.1 * drafted  # the acceptance path is exercised
    tv = 0.5 * sum(abs(counts[k] / n - e) for k, e in exact.items())
    # 16 outcomes, n = 20000: E[TV] ~ 0.01 for an exact sampler; residual-from-p instead of p - q gives ~0.05+
    assert tv < 0.025, (tv, counts.most_common(4))
