"""The prompt cache with the real Gemma-3-270M target and the shipped DFlash drafter (real acceptance, CPU).

Outputs are compared with the cache-off output under the regret gate (tests/helpers/oracle.py); cached runs must reuse
at least 90% of the prompt and keep the acceptance of the uncached run within 2 points."""

from __future__ import annotations

import pytest

from tests.helpers.oracle import Oracle
from pydflash.cache import CacheConfig
from pydflash.config import EngineConfig
from pydflash.defaults import default_pair
from pydflash.engine.engine import Engine
from pydflash.engine.request import Request
from pydflash.pair import load_pair

pytestmark = pytest.mark.real_model

# Counting: a continuation the shipped drafter predicts well (~70% of drafts accepted), so acceptance is a
# sensitive probe of the drafter's restored features (stale or missing ones collapse it).
PROMPT = "Count with me: " + ", ".join(str(i) for i in range(1, 80)) + ","  # ~310 tokens
LONG = "Count with me: " + ", ".join(str(i) for i in range(1, 110)) + ","  # ~430 tokens
TURNS = [" Keep going:", " And more:", " Go on,", " Further:", " Continue:"]
N_GEN = 32


@pytest.fixture(scope="module")
def pair():
    d = default_pair()
    p = load_pair(d.target, d.drafter)
    yield p
    p.close()


@pytest.fixture(scope="module")
def oracle(pair):
    o = Oracle(pair.target.path)
    yield o
    o.close()


def engine(pair, cache, n_slots=1):
    return Engine(pair, EngineConfig(n_slots=n_slots, n_ctx_slot=1024), cache=cache)


def run(eng, reqs):
    out = eng.run(reqs)
    return [out[r.id] for r in reqs]


def check_runs(results, prompt, base, oracle):
    first = results[0].stats
    assert first.n_cached == 0 and first.n_drafted > 0
    for i, res in enumerate(results):
        oracle.check(prompt, res.tokens, base_tokens=base)
        if i:
            assert res.stats.n_cached >= 0.9 * len(prompt), (i, res.stats.n_cached, len(prompt))
            assert abs(res.stats.accept_rate - first.accept_rate) <= 0.02, (i, res.stats.accept_rate, first.accept_rate)


def test_same_prompt_five_times_one_slot(pair, oracle):
    prompt = pair.target.tokenize(PROMPT)
    assert 280 <= len(prompt) <= 420, len(prompt)
    off = engine(pair, CacheConfig(reuse=False, ram_mib=0))
    base = run(off, [Request(prompt, max_tokens=N_GEN, ignore_eos=True)])[0].tokens
    off.close()
    eng = engine(pair, CacheConfig())
    results = [run(eng, [Request(prompt, max_tokens=N_GEN, ignore_eos=True)])[0] for _ in range(5)]
    check_runs(results, prompt, base, oracle)
    eng.close()


def test_same_prompt_five_times_across_slots(pair, oracle):
    """Two slots; each round a request sharing only the first part of the prompt comes first and takes the slot
    holding the prompt (its sequence goes to the device tier, every one kept here), so the prompt is restored from
    the device tier into the other slot."""
    prompt = pair.target.tokenize(PROMPT)
    off = engine(pair, CacheConfig(reuse=False, ram_mib=0))
    base = run(off, [Request(prompt, max_tokens=N_GEN, ignore_eos=True)])[0].tokens
    off.close()
    eng = engine(pair, CacheConfig(keep_all=True), n_slots=2)
    results, seqs = [], []
    for k in range(5):
        other = prompt[:200] + prompt[1 + k : 201 + k]  # longer than the prompt's sequence: more to lose
        if k:
            run(eng, [Request(other, max_tokens=1, ignore_eos=True)])  # takes the slot holding the prompt
        results.append(run(eng, [Request(prompt, max_tokens=N_GEN, ignore_eos=True)])[0])
        seqs.append(next(i for i, r in enumerate(eng.prompt_cache.resident)
                         if r is not None and r.tokens[: len(prompt)].tolist() == prompt))
    check_runs(results, prompt, base, oracle)
    assert len(set(seqs)) == 2 and eng.prompt_cache.device.hits >= 4, (seqs, eng.prompt_cache.metrics())
    eng.close()


def test_six_turn_chat_past_the_window(pair, oracle):
    """A chat growing past the 512-token sliding window: every turn resends the history (the last answer
    re-rendered from its third-to-last token) plus a new message; cache on and off agree on every turn."""
    on, off = engine(pair, CacheConfig()), engine(pair, CacheConfig(reuse=False, ram_mib=0))
    history = pair.target.tokenize(LONG)
    accepted = {"on": 0, "off": 0}
    for turn in range(6):
        prompt = history + (pair.target.tokenize(TURNS[turn - 1], add_special=False) if turn else [])
        r_off = run(off, [Request(prompt, max_tokens=24, ignore_eos=True)])[0]
        r_on = run(on, [Request(prompt, max_tokens=24, ignore_eos=True)])[0]
        oracle.check(prompt, r_on.tokens, base_tokens=r_off.tokens)
        if turn:
            assert r_on.stats.n_cached >= 0.9 * len(prompt), (turn, r_on.stats.n_cached, len(prompt))
            # the history's features came from earlier verify forwards instead of one prefill: float noise moves
            # a draft or two per turn, and with them where 24 tokens' steps end (5 steps of 15 drafts against 7 moved
            # the rate 10 points, in either direction); stale features make the cached turn draft far worse
            assert r_on.stats.accept_rate >= r_off.stats.accept_rate - 0.12, (turn, r_on.stats, r_off.stats)
            for key, r in (("on", r_on), ("off", r_off)):
                accepted[key] += r.stats.n_accepted
        history = prompt + r_on.tokens[:-3]
    assert len(prompt) > 512, len(prompt)
    # over turns 2-6, the drafts accepted (the same 24 tokens a turn on both sides), not their rate: one more step at
    # a turn's end adds 15 drafted tokens and moves the pooled rate 2 points with the same acceptances (drafter
    # version 7: 121 accepted in 21 steps cached, 122 in 20 not, rates 0.384 / 0.407); what would fail it is the
    # cached side's drop
    assert accepted["on"] >= 0.9 * accepted["off"], accepted
    on.close()
    off.close()
