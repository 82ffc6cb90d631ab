"""Sampling controls (logit_bias, min_p, presence/frequency/repeat penalties) under speculation.

- the pure transforms (``engine/controls.py``) against llama.cpp's formulas, and the validation of every field;
- the engine on the tiny llama pair: a banned token never comes out; greedy speculation with the controls gives
  plain decoding's tokens with the same controls; the first three sampled tokens with speculation follow plain
  sampling with penalties + logit_bias (chi-square, both modes, as tests/engine/test_rejection_sampling.py);
- a request without controls keeps the backend chains and no host sampler.
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest

from pydflash.engine import controls
from pydflash.engine.request import Request
from pydflash.errors import InvalidRequest

# --- the pure transforms ----------------------------------------------------------------------------------


def test_penalties_follow_llama_cpp():
    """z / repeat for z > 0, z * repeat for z <= 0, then - c * frequency - presence, for counted tokens only."""
    z = np.array([2.0, -1.0, 0.5, 3.0], dtype=np.float32)
    controls.Penalties(repeat=2.0, frequency=0.25, presence=0.5).apply(z, {0: 2, 1: 1})
    np.testing.assert_allclose(z, [2.0 / 2 - 0.5 - 0.5, -1.0 * 2 - 0.25 - 0.5, 0.5, 3.0])
    assert not controls.Penalties().on and not controls.Penalties(repeat=1.3, last_n=0).on
    assert controls.Penalties(presence=0.1).on


def test_window_counts_the_last_n_tokens():
    w = controls.Window([1, 2, 2, 3], last_n=3)
    assert dict(w.counts) == {2: 2, 3: 1}
    c = w.copy()
    c.push(4)
    c.push(4)
    assert dict(c.counts) == {3: 1, 4: 2} and dict(w.counts) == {2: 2, 3: 1}  # the copy leaves w alone
    assert dict(controls.Window([5, 5], last_n=-1).counts) == {5: 2}
    assert not controls.Window([5, 5], last_n=0).counts


def test_distribution_filters_in_the_chain_order():
    z = np.log(np.array([0.5, 0.3, 0.15, 0.05], dtype=np.float32))
    np.testing.assert_allclose(controls.distribution(z, 1.0), [0.5, 0.3, 0.15, 0.05], rtol=1e-6)
    np.testing.assert_allclose(controls.distribution(z, 1.0, top_k=2), [0.625, 0.375, 0, 0], rtol=1e-6)
    np.testing.assert_allclose(controls.distribution(z, 1.0, top_p=0.8), [0.625, 0.375, 0, 0], rtol=1e-6)
    # min_p keeps p >= 0.25 x max p = 0.125: three tokens
    np.testing.assert_allclose(controls.distribution(z, 1.0, min_p=0.25), np.array([0.5, 0.3, 0.15, 0]) / 0.95,
                               rtol=1e-6)
    cold = controls.distribution(z, 0.5)
    np.testing.assert_allclose(cold, np.array([0.25, 0.09, 0.0225, 0.0025]) / 0.365, rtol=1e-6)
    z[0] = -np.inf  # banned
    assert controls.distribution(z, 1.0)[0] == 0.0
    assert controls.argmax(np.full(3, -np.inf, dtype=np.float32)) is None


@pytest.mark.parametrize("kw, field", [
    (dict(logit_bias={"x": 1}), "logit_bias"),
    (dict(logit_bias={-3: 1}), "logit_bias"),
    (dict(logit_bias={3: 101}), "logit_bias"),
    (dict(logit_bias={3: float("nan")}), "logit_bias"),
    (dict(logit_bias=[3, 1]), "logit_bias"),
    (dict(min_p=1.5), "min_p"),
    (dict(min_p=-0.1), "min_p"),
    (dict(presence_penalty=2.5), "presence_penalty"),
    (dict(frequency_penalty=float("nan")), "frequency_penalty"),
    (dict(repeat_penalty=0.0), "repeat_penalty"),
    (dict(repeat_penalty=5e-324), "repeat_penalty"),  # a subnormal divisor overflows a logit to inf
    (dict(repeat_penalty=True), "repeat_penalty"),
    (dict(repeat_last_n=-2), "repeat_last_n"),
    (dict(repeat_last_n=1.5), "repeat_last_n"),
])
def test_bad_values_name_their_field(kw, field):
    with pytest.raises(InvalidRequest, match=field):
        Request("x", **kw)


def test_bias_normalised_and_bans_are_minus_inf():
    r = Request("x", logit_bias={"7": -100, 3: 2.5, 9: -math.inf, 4: -99.5})
    assert r._bias == ((3, 2.5), (4, -99.5), (7, -math.inf), (9, -math.inf))


def test_plain_requests_keep_the_backend_chains():
    """No control: the chains are today's tuples and nothing is sampled on the host."""
    assert Request("x").sampling == ("greedy",) and Request("x").draft_sampling == ("greedy",)
    r = Request("x", temperature=0.7, top_k=4, seed=1)
    assert not r.on_host and r.sampling == ("dist", 0.7, 4, 1.0, 0.0, (), 1)
    assert not Request("x", logit_bias={3: -100}, min_p=0.1, temperature=1.0).on_host  # backend chain controls
    assert Request("x", repeat_penalty=1.1).on_host and Request("x", presence_penalty=0.5).on_host
    assert not Request("x", repeat_penalty=1.1, repeat_last_n=0).on_host


def test_an_exact_drafter_is_accepted_whole_blocks():
    """The host sampler on a Markov "model" (the row after token t is table[t]) whose plain greedy text is shaped
    by penalties. A drafter that proposes that very text is accepted whole blocks and the commits equal plain
    decoding only if every verify row is penalised by the drafts before it in the block."""
    from pydflash.engine.controlled import HostSampler

    rng = np.random.default_rng(0)
    v = 12
    table = rng.normal(size=(v, v)).astype(np.float32)
    table[:, 3] += 4.0  # unpenalised, token 3 would follow everything
    kw = dict(repeat_penalty=3.0, presence_penalty=1.0, frequency_penalty=0.5, repeat_last_n=8)
    prompt = [1, 2]

    plain = HostSampler(Request(prompt, **kw), prompt, None, eos=0)
    text = list(prompt)
    for _ in range(24):
        text += plain.commit([], lambda i, text=text: table[text[-1]].copy())[1]
    assert len(set(text[2:8])) > 3  # the penalties did shape it

    spec = HostSampler(Request(prompt, **kw), prompt, None, eos=0)
    got, accepted, k = list(prompt), 0, 4
    while len(got) < len(text):
        n = len(got)
        want = text[n : n + k]  # the exact drafter: block row i favours the plain text's next token
        drafts = spec.draft(
            lambda i, want=want: np.where(np.arange(v) == (want + [0])[i], 9.0, 0.0).astype(np.float32), len(want))
        assert drafts == want
        path = got + drafts
        m, committed = spec.commit(drafts, lambda i, path=path, n=n: table[path[n - 1 + i]].copy())
        accepted += m
        got += committed
    assert got[: len(text)] == text
    assert accepted >= len(text) - len(prompt) - 8  # nearly every draft (one bonus token a block is no draft)


# --- the engine -------------------------------------------------------------------------------------------

PROMPT = "the cat sat on the mat and"
CONTROLS = {
    "bias": dict(logit_bias={}),  # filled with the tokens plain greedy emits (pair fixture)
    "penalties": dict(repeat_penalty=1.5, presence_penalty=0.5, frequency_penalty=0.5, repeat_last_n=16),
    "both": dict(repeat_penalty=1.3, frequency_penalty=1.0, logit_bias={}),
}
HEAD = 12
N_SAMPLES = 400
SAMPLING = dict(temperature=0.7, top_k=4)  # a few dozen 3-token outcomes: the chi-square has power


def _config(draft_max=3):
    from pydflash.config import EngineConfig

    return EngineConfig(n_slots=8, n_ctx_slot=128, adaptive=False, draft_max=draft_max)


@pytest.fixture(scope="module")
def pair(tiny, tmp_path_factory):
    """The tiny llama target, a ban list (its greedy output's first tokens), and a drafter whose reduced head
    holds the tokens the target emits most under the controls, so drafts are accepted and rejected both."""
    from pydflash import api
    from pydflash.compat.reduced_head import write_reduced_head

    p = tiny("llama")
    with api.load(p.target, config=_config(0)) as llm:
        # the prompt ends with the target's own greedy text, which repeats itself: the penalties bite from token 1
        toks = llm.tokenize(PROMPT)
        toks += llm.generate(toks, max_tokens=12, ignore_eos=True).tokens
        greedy = llm.generate(toks, max_tokens=8, ignore_eos=True).tokens
        ban = {t: -100 for t in greedy[:2]}
        freq = Counter()
        for kw in [dict(CONTROLS["penalties"]), dict(CONTROLS["both"], logit_bias=ban)]:
            for s in range(60):
                freq.update(llm.generate(toks, max_tokens=3, ignore_eos=True, seed=s, **SAMPLING, **kw).tokens)
    head = [t for t, _ in freq.most_common(HEAD)]
    drafter = write_reduced_head(p.drafter, p.target, head, tmp_path_factory.mktemp("head") / "d.gguf",
                                 head_type="F32")
    return p, toks, ban, drafter


@pytest.fixture(scope="module")
def llms(pair):
    from pydflash import api

    p, _, _, drafter = pair
    with api.load(p.target, config=_config(0)) as plain, api.load(p.target, drafter, config=_config()) as spec:
        yield plain, spec


def _kw(name: str, ban: dict) -> dict:
    kw = dict(CONTROLS[name])
    if "logit_bias" in kw:
        kw["logit_bias"] = ban
    return kw


def test_a_banned_token_never_comes_out(pair, llms):
    _, toks, ban, _ = pair
    plain, spec = llms
    assert set(plain.generate(toks, max_tokens=8, ignore_eos=True).tokens) & set(ban)
    for temperature in (0.0, 1.0):
        for llm in (plain, spec):
            outs = [llm.generate(toks, max_tokens=24, ignore_eos=True, temperature=temperature, seed=s,
                                 logit_bias=ban).tokens for s in range(4)]
            assert not set().union(*outs) & set(ban)


@pytest.mark.parametrize("name", list(CONTROLS))
def test_greedy_speculation_equals_plain_decoding_with_the_controls(pair, llms, name):
    """The tiny f32 target has no near-ties at these positions: the tokens are equal, not just within the
    oracle's regret band. (This random drafter's argmax rarely hits the target's; acceptance along a block is
    ``test_an_exact_drafter_is_accepted_whole_blocks``'s.)"""
    _, toks, ban, _ = pair
    plain, spec = llms
    kw = dict(max_tokens=40, ignore_eos=True, **_kw(name, ban))
    want = plain.generate(toks, **kw)
    got = spec.generate(toks, **kw)
    assert got.tokens == want.tokens
    assert got.stats.n_drafted > 0
    # without the controls the text is another one: the controls did something
    assert plain.generate(toks, max_tokens=40, ignore_eos=True).tokens != want.tokens


def _histogram(llm, toks, kw: dict, mode: str, seed0: int) -> tuple[Counter, int, int]:
    reqs = [Request(toks, max_tokens=3, ignore_eos=True, seed=seed0 + s, sampling_mode=mode, **SAMPLING, **kw)
            for s in range(N_SAMPLES)]
    res = llm.generate_many(reqs)
    return (Counter(tuple(r.tokens) for r in res), sum(r.stats.n_drafted for r in res),
            sum(r.stats.n_accepted for r in res))


@pytest.mark.parametrize("mode", ["rejection", "match"])
@pytest.mark.parametrize("name", ["penalties", "both"])
def test_first_three_sampled_tokens_follow_plain_sampling(pair, llms, name, mode):
    """Penalties change p at positions 2 and 3 through the tokens before them, drafted ones included: the joint of
    the first three tokens with speculation against plain sampling with the same controls (chi-square at alpha
    1e-3), and each histogram against plain sampling without them (the controls must move it)."""
    from tests.engine.test_rejection_sampling import _chi_square_ok

    _, toks, ban, _ = pair
    plain, spec = llms
    kw = _kw(name, ban)
    want = _histogram(plain, toks, kw, "match", seed0=10**6)[0]
    got, drafted, accepted = _histogram(spec, toks, kw, mode, seed0=0)
    ok, msg = _chi_square_ok(want, got)
    assert ok, (msg, want.most_common(5), got.most_common(5))
    assert drafted > 0 and accepted > 0
    free = _histogram(plain, toks, {}, "match", seed0=2 * 10**6)[0]
    assert not _chi_square_ok(free, got)[0]


def test_unknown_token_id_is_refused_before_queueing(pair, llms):
    _, toks, _, _ = pair
    _, spec = llms
    engine = spec.engine
    with pytest.raises(InvalidRequest, match="logit_bias"):
        engine.submit(Request(toks, max_tokens=4, logit_bias={engine.model.n_vocab: -100}))
    assert not engine.queue
