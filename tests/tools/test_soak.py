"""scripts/dev/soak.py: its scenarios are the seed's alone and cover what they claim, a clean engine passes them, and
an engine that commits one wrong token is caught."""

from __future__ import annotations

import pytest

from pydflash.errors import InvariantError
from tests.helpers.bench import load_bench
from tests.helpers.oracle import Oracle

soak = load_bench("soak", "pydflash_soak", register=True, folder="dev")


def test_a_seed_draws_one_scenario_and_the_seeds_cover_every_kind_of_request():
    assert soak.draw(11) == soak.draw(11)
    assert soak.draw(11) != soak.draw(12)
    scenarios = [soak.draw(s) for s in range(40)]
    asks = [a for sc in scenarios for a in sc.asks]
    prompts = [a.prompt for a in asks]
    assert len(set(prompts)) < len(prompts)  # repeated prompts: whole-prompt cache hits
    assert any(a.cancel_after is not None for a in asks)
    assert any(a.stop_at is not None for a in asks) and any(not a.ignore_eos for a in asks)
    assert {a.draft_max for a in asks} == {None, 0, 2}
    assert {sc.arch for sc in scenarios} == set(soak.ARCHS)
    assert {sc.engine["adaptive"] for sc in scenarios} == {True, False}
    assert {sc.cache["ram_mib"] > 0 for sc in scenarios} == {True, False}
    assert {sc.engine["n_ubatch"] for sc in scenarios} == {32, 64, 512}
    assert {sc.engine["n_ctx_slot"] for sc in scenarios} == {256, 1024}  # small slots: requests refused at submit
    assert any(a.temperature > 0 for a in asks) and any(a.temperature == 0 for a in asks)
    # arrivals never go back in time (the run submits each at its step)
    assert all([a.arrive for a in sc.asks] == sorted(a.arrive for a in sc.asks) for sc in scenarios)


def scenario() -> "soak.Scenario":
    """Two slots drafting 3 a step, a phrase that loops (copies get accepted), a stop inside the output, and the
    first prompt again once its slot is free (over one 32-token cache block: a hit)."""
    loop = "the water was long " * 12
    asks = [soak.Ask(prompt=loop, max_tokens=24, ignore_eos=True,
                     draft_max=None, cache_prompt=True, arrive=0, stop_at=0.5),
            soak.Ask(prompt="one two three four", max_tokens=20, ignore_eos=True, draft_max=None, cache_prompt=True,
                     arrive=0),
            soak.Ask(prompt=loop, max_tokens=16, ignore_eos=False,
                     draft_max=None, cache_prompt=True, arrive=40)]
    return soak.Scenario(seed=5, arch="qwen3", engine={"n_slots": 2, "n_ctx_slot": 512, "draft_max": 3},
                         cache={}, asks=asks)


@pytest.fixture(scope="module")
def qwen3(tiny):
    p = tiny("qwen3")
    oracle = Oracle(p.target)
    yield p, oracle
    oracle.close()


def test_a_clean_engine_passes(qwen3):
    p, oracle = qwen3
    out = soak.run(scenario(), p, oracle)
    assert out["problems"] == []
    assert out["stats"]["drafted"] > 0 and out["stats"]["cached"] > 0  # it drafted, and the repeat hit the cache


def test_an_engine_that_accepts_one_draft_too_many_is_caught(qwen3, monkeypatch):
    """A rejected draft committed as if accepted (an off-by-one in the acceptance rule): the soak must report it."""
    p, oracle = qwen3
    import pydflash.engine.engine as engine_mod

    real = engine_mod.greedy_accept

    def one_too_many(drafts, picks):
        m = real(drafts, picks)
        return m + 1 if m < len(drafts) else m

    monkeypatch.setattr(engine_mod, "greedy_accept", one_too_many)
    try:
        out = soak.run(scenario(), p, oracle)
    except InvariantError:  # the engine's own invariants may fire first: caught as well (nothing else is)
        return
    assert out["problems"], "a wrong token was committed and the soak saw nothing"
