"""Admission: typed errors before any decoding; the boundary prompt fits, one more token does not."""

from __future__ import annotations

import pytest

from pydflash import api
from pydflash.config import EngineConfig
from pydflash.engine.request import Request
from pydflash.errors import ContextOverflow, InvalidRequest


@pytest.fixture(scope="module")
def llm(tiny):
    p = tiny("qwen3")
    with api.load(p.target, p.drafter, config=EngineConfig(n_ctx_slot=128)) as llm:
        yield llm


def test_empty_prompt(llm):
    with pytest.raises(InvalidRequest):
        llm.engine.submit(Request(""))
    with pytest.raises(InvalidRequest):
        llm.engine.submit(Request([]))


@pytest.mark.parametrize("bad", [-1, 10**6])
def test_out_of_vocab_token(llm, bad):
    with pytest.raises(InvalidRequest, match="outside the vocabulary"):
        llm.engine.submit(Request([1, 2, bad], max_tokens=4))
    assert not llm.engine.has_work  # nothing was queued


@pytest.mark.parametrize("n", [0, -3])
def test_bad_max_tokens(n):
    with pytest.raises(ValueError):
        Request("x", max_tokens=n)


def test_context_boundary(llm):
    eng = llm.engine
    max_tokens = 10
    fits = 128 - max_tokens - eng.block_size
    res = llm.generate([5] * fits, max_tokens=max_tokens, ignore_eos=True)
    assert len(res.tokens) == max_tokens
    with pytest.raises(ContextOverflow):
        eng.submit(Request([5] * (fits + 1), max_tokens=max_tokens))
    assert not eng.has_work
    # the engine still works afterwards
    assert len(llm.generate([5, 6, 7], max_tokens=3, ignore_eos=True).tokens) == 3


def test_per_request_draft_length(llm):
    res = llm.generate([5, 6, 7], max_tokens=12, ignore_eos=True, draft_max=3)
    assert res.stats.n_drafted <= 3 * res.stats.n_steps
    res0 = llm.generate([5, 6, 7], max_tokens=12, ignore_eos=True, draft_max=0)
    assert res0.stats.n_drafted == 0 and res0.stats.n_steps == 12
