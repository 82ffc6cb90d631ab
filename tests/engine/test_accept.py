"""Acceptance rules, pure (no native library)."""

import random

import pytest

from pydflash.engine.accept import commit_tokens, greedy_accept, synthetic_accept, synthetic_rate


def test_greedy_accept_prefix_and_bonus():
    drafts = [5, 6, 7, 8]
    target = [5, 6, 9, 8, 1]  # target disagrees at draft 3
    m = greedy_accept(drafts, target)
    assert m == 2
    assert commit_tokens(drafts, target, m) == [5, 6, 9]


def test_greedy_accept_all_and_none():
    assert greedy_accept([1, 2], [1, 2, 3]) == 2
    assert commit_tokens([1, 2], [1, 2, 3], 2) == [1, 2, 3]
    assert greedy_accept([4, 2], [1, 2, 3]) == 0
    assert commit_tokens([4, 2], [1, 2, 3], 0) == [1]
    assert greedy_accept([], [7]) == 0  # plain decoding: the bonus alone


def test_greedy_accept_rejects_bad_lengths():
    with pytest.raises(ValueError):
        greedy_accept([1, 2], [1, 2])


@pytest.mark.parametrize("length,k", [(1.0, 15), (2.0, 15), (4.0, 15), (8.0, 15), (3.5, 4)])
def test_synthetic_rate_hits_mean_length(length, k):
    p = synthetic_rate(length, k)
    expect = 1 + sum(p**j for j in range(1, k + 1))
    assert expect == pytest.approx(length, abs=1e-6)
    rng = random.Random(1)
    n = 20000
    mean = 1 + sum(synthetic_accept(k, p, rng) for _ in range(n)) / n
    assert mean == pytest.approx(length, rel=0.05)


def test_synthetic_rate_bounds():
    assert synthetic_rate(16, 15) == 1.0
    with pytest.raises(ValueError):
        synthetic_rate(17, 15)
    with pytest.raises(ValueError):
        synthetic_rate(0.5, 15)
