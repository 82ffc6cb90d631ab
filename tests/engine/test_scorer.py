"""The scorer keeps what it last scored: a call that extends it (a stream's frames) decodes only the new tokens, and
what it returns equals a fresh score; a call that shares only part of the kept tokens trims the rest first."""

from __future__ import annotations

import numpy as np
import pytest

from pydflash.engine.scorer import CHUNK, Scorer
from pydflash.native import Model


@pytest.fixture(scope="module")
def pair(tiny):
    return tiny("gemma3")  # sliding-window layers (window 64) beside global ones, as the real target


@pytest.fixture(scope="module")
def model(pair):
    return Model(pair.target)


def _tokens(model, n, seed):
    rng = np.random.default_rng(seed)
    return [model.bos] + [int(t) for t in rng.integers(10, 200, n - 1)]


def _check_equal(got, want):
    assert [s.token for s in got] == [s.token for s in want]
    for a, b in zip(got, want):
        if b.logprob is None:
            assert a.logprob is None
            continue
        assert abs(a.logprob - b.logprob) < 1e-3
        assert [t for t, _ in a.top] == [t for t, _ in b.top] or all(
            abs(x - y) < 1e-3 for (_, x), (_, y) in zip(a.top, b.top))


def test_extension_decodes_only_the_new_tokens(model):
    fresh, reused = Scorer(model, 512), Scorer(model, 512)
    try:
        toks = _tokens(model, 150, 0)
        want = fresh.score(toks, 3)
        # a stream: the prompt, then frames of 5 tokens each, each frame scoring only its own tokens
        got = reused.score(toks[:40], 3)
        for end in range(45, 151, 5):
            before = reused.ctx._decodes()
            part = reused.score(toks[:end], 3, first=end - 5)
            assert len(part) == 5
            # the 5 new positions need the logits of the last sent token onwards: one decode, not the whole prefix
            assert reused.ctx._decodes() - before == 1
            got += part
        _check_equal(got, want)
    finally:
        fresh.close()
        reused.close()


def test_a_diverging_sequence_is_scored_as_afresh(model):
    fresh, reused = Scorer(model, 512), Scorer(model, 512)
    try:
        a = _tokens(model, 200, 1)
        b = a[:20] + _tokens(model, 31, 2)[1:]  # shares 20 tokens with a, whose KV went past the window
        reused.score(a, 2)
        _check_equal(reused.score(b, 2), fresh.score(b, 2))
        c = b[:40] + a[100:110]  # shares 40 tokens with b, all within the window: the kept prefix serves
        before = reused.ctx._decodes()
        _check_equal(reused.score(c, 2, first=40), fresh.score(c, 2)[40:])
        assert reused.ctx._decodes() - before == 1 and CHUNK > 11
        _check_equal(reused.score(a[:1], 2), fresh.score(a[:1], 2))
    finally:
        fresh.close()
        reused.close()
