"""Sampling (temperature > 0) with speculation keeps the target's distribution: sample-and-match.

The drafter's argmax is accepted iff it equals the target's own backend sample at that position; for a
deterministic drafter that is exact speculative sampling. We compare the empirical distribution of the first
generated tokens with and without speculation over many seeds. The same seed draws the same uniforms in both
runs here, so the two samples are coupled and a tight TV bound holds; rejection sampling draws its own and is
tested with independent samples in test_rejection_sampling.py.
"""

from __future__ import annotations

from collections import Counter

from pydflash import api
from pydflash.config import EngineConfig
from pydflash.engine.request import Request

N = 300


def histogram(llm, toks, n_tokens):
    reqs = [Request(toks, max_tokens=n_tokens, ignore_eos=True, temperature=1.0, seed=s, sampling_mode="match")
            for s in range(N)]
    return Counter(tuple(r.tokens) for r in llm.generate_many(reqs))


def tv(a: Counter, b: Counter) -> float:
    keys = set(a) | set(b)
    return 0.5 * sum(abs(a[k] - b[k]) for k in keys) / N


def test_speculative_sampling_matches_plain_distribution(tiny):
    p = tiny("qwen3")
    cfg = EngineConfig(n_slots=8, n_ctx_slot=256)
    with api.load(p.target, config=cfg) as plain, api.load(p.target, p.drafter, config=cfg) as spec:
        toks = plain.tokenize("the the the")
        # a low-entropy prefix makes drafts get accepted sometimes, so the acceptance path is exercised
        hp, hs = histogram(plain, toks, 2), histogram(spec, toks, 2)
        stats = spec.generate(toks, max_tokens=2, ignore_eos=True, temperature=1.0, seed=1).stats
    assert stats.n_drafted > 0
    # two samples of one distribution over a few dozen outcomes: TV well below what a biased sampler gives
    assert tv(hp, hs) < 0.15, (hp.most_common(5), hs.most_common(5))


def test_sampling_is_reproducible_and_temperature_zero_is_greedy(tiny):
    p = tiny("llama")
    with api.load(p.target, p.drafter, config=EngineConfig(n_ctx_slot=256)) as llm:
        toks = llm.tokenize("hello")
        a = llm.generate(toks, max_tokens=16, ignore_eos=True, temperature=0.8, seed=7).tokens
        b = llm.generate(toks, max_tokens=16, ignore_eos=True, temperature=0.8, seed=7).tokens
        g1 = llm.generate(toks, max_tokens=16, ignore_eos=True).tokens
        g2 = llm.generate(toks, max_tokens=16, ignore_eos=True, temperature=0.0, seed=3).tokens
    assert a == b
    assert g1 == g2
