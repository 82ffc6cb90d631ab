"""Adaptive drafting: a drafter whose drafts do not pay is mostly switched off (and keeps output lossless)."""

from __future__ import annotations

from pydflash import api
from pydflash.config import EngineConfig
from pydflash.engine import adaptive
from pydflash.engine.slot import Slot
from pydflash.engine.stats import Stats
from pydflash.engine.text import TextStream
from pydflash.engine.request import Request


def slot(k=15):
    return Slot(seq=0, request=Request("x"), prompt=[1], draft_max=k, stats=Stats(), text=TextStream())


def test_useless_drafts_pause_with_growing_backoff():
    costs = adaptive.StepCosts(t_spec=2.0, t_plain=1.0)  # drafting doubles the step time
    s = slot()
    pauses = []
    for _ in range(6):
        while adaptive.plan_drafts(s, costs) == 0:
            pass
        adaptive.observe_acceptance(s, 15, 0, costs)  # nothing accepted
        pauses.append(s.pause)
    assert pauses == sorted(pauses) and pauses[-1] == adaptive.MAX_BACKOFF


def test_paying_drafts_keep_drafting():
    costs = adaptive.StepCosts(t_spec=2.0, t_plain=1.0)
    s = slot()
    for _ in range(20):
        assert adaptive.plan_drafts(s, costs) == 15
        adaptive.observe_acceptance(s, 15, 6, costs)  # 1 + 6 tokens per step at 2x the cost: pays
    assert s.pause == 0


def test_adaptive_engine_with_random_drafter(tiny):
    """The tiny random drafter accepts ~nothing: adaptive mode drafts in a small fraction of steps, and the
    output is still the plain greedy output."""
    p = tiny("llama")
    with api.load(p.target, config=EngineConfig(n_ctx_slot=512)) as plain:
        toks = plain.tokenize("hello world")
        base = plain.generate(toks, max_tokens=200, ignore_eos=True).tokens
    with api.load(p.target, p.drafter, config=EngineConfig(n_ctx_slot=512, adaptive=True)) as llm:
        res = llm.generate(toks, max_tokens=200, ignore_eos=True)
        # pending features of paused steps were injected in batches; the invariants were checked every step
    assert res.tokens == base
    assert res.stats.n_draft_steps < 0.2 * res.stats.n_steps
