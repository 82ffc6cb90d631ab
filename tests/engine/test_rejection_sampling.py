"""Rejection sampling over a draft block keeps the target's distribution.

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


def test_two_level_sample_is_the_inverse_cdf():
    """sample() searches block sums, then one block: the same index as a float64 inverse CDF over the whole
    vector, across block boundaries, with a ragged last block and runs of zeros (never picked)."""
    rng = np.random.default_rng(7)
    w = rng.random(3 * 1024 + 77).astype(np.float32)
    w[rng.random(len(w)) < 0.3] = 0.0
    w[1024:2048] = 0.0  # a whole empty block
    cdf = np.cumsum(w, dtype=np.float64)
    us = np.concatenate([rng.random(4000), [0.0, 1.0 - 1e-12]])
    got = np.array([R.sample(w, u) for u in us])
    want = np.minimum(np.searchsorted(cdf, us * cdf[-1], side="right"), len(w) - 1)
    assert (w[got] > 0).all()
    assert np.mean(got == want) > 0.999  # only a target within float noise of a boundary may differ
    # dense() of a top-p row scatters only the positive prefix, and equals the full scatter
    order = rng.permutation(len(w)).astype(np.int32)
    probs = np.sort(rng.random(len(w)).astype(np.float32))[::-1].copy()
    probs[50:] = 0.0
    full = np.zeros(len(w), dtype=np.float32)
    full[order] = probs
    np.testing.assert_array_equal(R.dense((order, probs), len(w)), full)


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
        # an unreadable row (None) finishes the block as sample-and-match; speculative_commit calls the row
        # getters at once, in this iteration (the defaults only make that binding explicit)
        p_of = lambda i, ps=ps, drafts=drafts: (  # noqa: E731
            None if unreadable and rng.random() < 0.2 else ps[i][drafts[i]])
        m, committed = R.speculative_commit(
            drafts, picks, p_of, lambda i, qs=qs, drafts=drafts: qs[i][drafts[i]],
            lambda i, ps=ps, qs=qs: (ps[i], qs[i]), rng)
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
    n, rng = 12000, random.Random(5)
    counts, drafted, accepted = Counter(), 0, 0
    for _ in range(n):
        toks, d, a = _simulate(lambda c: table_p[c[-1:]], lambda c: table_q[c[-1:]], 2, 2, rng, unreadable)
        counts[toks] += 1
        drafted, accepted = drafted + d, accepted + a
    assert accepted > 0.1 * drafted  # the acceptance path is exercised
    tv = 0.5 * sum(abs(counts[k] / n - e) for k, e in exact.items())
    # 16 outcomes, n = 12000: TV 0.009-0.010 measured for this sampler; a residual of p instead of p - q, or
    # accepting with min(1, 1.5 p/q), gives 0.1 to 0.3
    assert tv < 0.04, (tv, counts.most_common(4))


# --- the engine on a tiny pair ------------------------------------------------------------------------------

PROMPT = "the the the"
CONFIGS = [dict(temperature=0.7, top_k=4), dict(temperature=1.0, top_k=8, top_p=0.8)]
N_SAMPLES = 400  # per arm: a few dozen outcomes with >= 10 counts each
HEAD = 8  # tokens in the reduced drafter head


def _engine_config():
    from pydflash.config import EngineConfig

    return EngineConfig(n_slots=8, n_ctx_slot=128, adaptive=False, draft_max=3)


def _histogram(llm, toks, kw: dict, mode: str, seed0: int) -> tuple[Counter, int, int]:
    from pydflash.engine.request import Request

    reqs = [Request(toks, max_tokens=3, ignore_eos=True, seed=seed0 + s, sampling_mode=mode, **kw)
            for s in range(N_SAMPLES)]
    res = llm.generate_many(reqs)
    return (Counter(tuple(r.tokens) for r in res), sum(r.stats.n_drafted for r in res),
            sum(r.stats.n_accepted for r in res))


def _chi_square_ok(a: Counter, b: Counter, z: float = 3.09) -> tuple[bool, str]:
    """Two-sample chi-square homogeneity test over outcomes seen >= 10 times (the rest pooled), at the
    alpha = 1e-3 critical value (Wilson-Hilferty; z = 3.09)."""
    na, nb = sum(a.values()), sum(b.values())
    keys = set(a) | set(b)
    big = [k for k in keys if a[k] + b[k] >= 10]
    cells = [(a[k], b[k]) for k in big]
    rest = [k for k in keys if a[k] + b[k] < 10]
    if rest:
        cells.append((sum(a[k] for k in rest), sum(b[k] for k in rest)))
    stat = 0.0
    for x, y in cells:
        ex, ey = (x + y) * na / (na + nb), (x + y) * nb / (na + nb)
        stat += (x - ex) ** 2 / ex + (y - ey) ** 2 / ey
    df = len(cells) - 1
    crit = df * (1 - 2 / (9 * df) + z * (2 / (9 * df)) ** 0.5) ** 3
    return stat < crit, f"chi2 {stat:.1f} on {df} df, critical {crit:.1f}"


@pytest.fixture(scope="module")
def sampled_pair(tiny, tmp_path_factory):
    """The tiny llama target, its plain-sampling histograms per config, and a drafter whose reduced head holds
    the tokens plain sampling produces most: a random drafter over the whole vocabulary almost never overlaps
    the target, so this one makes acceptance (and the q = 0 outside the head path) actually happen."""
    from pydflash import api
    from pydflash.compat.reduced_head import write_reduced_head

    p = tiny("llama")
    with api.load(p.target, config=_engine_config()) as llm:
        toks = llm.tokenize(PROMPT)
        plain = [_histogram(llm, toks, kw, "match", seed0=10**6)[0] for kw in CONFIGS]
    freq = Counter()
    for h in plain:
        for seq, n in h.items():
            for t in seq:
                freq[t] += n
    head = [t for t, _ in freq.most_common(HEAD)]
    drafter = write_reduced_head(p.drafter, p.target, head, tmp_path_factory.mktemp("head") / "d.gguf",
                                 head_type="F32")
    return p, toks, plain, drafter


@pytest.fixture(scope="module")
def spec_llm(sampled_pair):
    from pydflash import api

    p, _, _, drafter = sampled_pair
    with api.load(p.target, drafter, config=_engine_config()) as llm:
        yield llm


# rejection mode's proposal (engine/proposal.py): chosen per step (auto), or pinned to one of the two by the margin
PROPOSALS = {"match": ("match", None), "rejection": ("rejection", None),
             "rejection-sampled": ("rejection", 0.0), "rejection-argmax": ("rejection", float("inf"))}


@pytest.mark.parametrize("mode", list(PROPOSALS))
@pytest.mark.parametrize("which", range(len(CONFIGS)), ids=["t0.7-topk4", "t1.0-topk8-topp0.8"])
def test_first_three_tokens_follow_plain_sampling(sampled_pair, spec_llm, mode, which, monkeypatch):
    """Spec decoding (seeds disjoint from the plain run's, so the two samples are independent) against plain
    sampling of the same target: the 3-token histograms agree, for each proposal rejection sampling can use."""
    from pydflash.engine import proposal

    mode, margin = PROPOSALS[mode]
    if margin is not None:
        monkeypatch.setattr(proposal, "SAMPLE_MARGIN", margin)
    _, toks, plain, _ = sampled_pair
    spec, drafted, accepted = _histogram(spec_llm, toks, CONFIGS[which], mode, seed0=0)
    ok, msg = _chi_square_ok(plain[which], spec)
    assert ok, (msg, plain[which].most_common(5), spec.most_common(5))
    assert drafted > 0
    if mode == "rejection":
        assert accepted > 0  # the acceptance path ran, not only recovered tokens


def test_temperature_to_zero_is_the_greedy_path(sampled_pair, spec_llm):
    """temperature 0 ignores the mode (greedy chains on both contexts); a tiny temperature makes p and q
    one-hot, so rejection sampling accepts what greedy accepts and commits the same tokens, up to float near-ties
    (the regret gate: the engine's earlier requests' kept cells, cut while these run, change the cells attention
    spans and so its float reduction); where the tokens are the same, so are the drafts and acceptances."""
    from pydflash.engine.request import Request
    from tests.helpers.oracle import Oracle

    _, toks, _, _ = sampled_pair
    assert Request(toks, sampling_mode="rejection").draft_sampling == ("greedy",)
    assert not Request(toks, temperature=0.0).rejection
    kw = dict(max_tokens=24, ignore_eos=True)
    greedy = spec_llm.generate(toks, **kw)
    zero = spec_llm.generate(toks, temperature=0.0, seed=3, sampling_mode="rejection", **kw)
    cold = spec_llm.generate(toks, temperature=1e-3, seed=3, sampling_mode="rejection", **kw)
    oracle = Oracle(sampled_pair[0].target)
    for out in (greedy, zero, cold):
        oracle.check(toks, out.tokens)
    oracle.close()
    if cold.tokens == greedy.tokens:
        assert (cold.stats.n_drafted, cold.stats.n_accepted) == (greedy.stats.n_drafted, greedy.stats.n_accepted)


def test_a_seed_reproduces_its_output(spec_llm, sampled_pair):
    _, toks, _, _ = sampled_pair
    kw = dict(max_tokens=16, ignore_eos=True, temperature=0.9, top_p=0.95, seed=11, sampling_mode="rejection")
    assert spec_llm.generate(toks, **kw).tokens == spec_llm.generate(toks, **kw).tokens


def test_a_bad_sampling_mode_is_refused():
    from pydflash.engine.request import Request
    from pydflash.errors import InvalidRequest

    with pytest.raises(InvalidRequest, match="sampling_mode"):
        Request("x", temperature=1.0, sampling_mode="typical")


# --- the shipped Gemma pair -------------------------------------------------------------------------------


@pytest.mark.real_model
def test_shipped_pair_acceptance_in_both_modes(gemma_path):
    """Temperature 0.7, the same prompts and seeds in both modes. The design expected rejection >= match here. With
    q sampled at every step it is not so on this pair: the drafter is less confident than the target at 0.7
    (mean max q 0.75 vs max p 0.86 at the first draft), so sum min(p, q) is no more than p(argmax q), and DFlash
    samples block positions independently, which makes later sampled drafts less coherent than the argmax chain.
    Rejection mode therefore chooses its proposal per step (engine/proposal.py) and mostly drafts the argmax
    here, where its rule is sample-and-match's. The texts still differ (other draws), so the rates differ by
    the noise of 72 tokens: the band below. docs/sampling.md has the numbers."""
    from pydflash import api
    from pydflash.config import EngineConfig
    from pydflash.defaults import SHIPPED_DRAFTER
    from pydflash.engine.request import Request

    prompts = [
        'def is_prime(n):\n    """Return True if n is a prime number."""\n',
        'def read_lines(path):\n    """Return the lines of a text file."""\n',
        "import os\nimport sys\n\n\ndef main():\n",
    ]
    rate = {}
    cfg = EngineConfig(n_slots=3, n_ctx_slot=256, adaptive=False, draft_max=4)
    with api.load(gemma_path, SHIPPED_DRAFTER, cfg) as llm:
        for mode in ("match", "rejection"):
            res = llm.generate_many([Request(p, max_tokens=24, temperature=0.7, seed=1, sampling_mode=mode)
                                     for p in prompts])
            rate[mode] = sum(r.stats.n_accepted for r in res) / sum(r.stats.n_drafted for r in res)
    assert rate["match"] > 0.1 and rate["rejection"] > 0.1, rate
    assert rate["rejection"] >= 0.7 * rate["match"], rate


# --- the CLI ----------------------------------------------------------------------------------------------


def _cli(*args):
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "pydflash.cli.speculative", *args], capture_output=True, text=True,
                          timeout=300)


def test_cli_temp_samples_and_reports_the_mode(tiny):
    import json

    p = tiny("llama")
    base = ["-m", str(p.target), "-md", str(p.drafter), "-p", "the the the", "-n", "12", "--json", "-s", "5"]
    outs = [json.loads(_cli(*base, "--temp", "0.8", "--top-k", "20", "--top-p", "0.9", *mode).stdout)
            for mode in ([], ["--sampling-mode", "match"])]
    assert [o["sampling_mode"] for o in outs] == ["rejection", "match"]
    assert all(o["n_generated"] == 12 and o["n_drafted"] > 0 for o in outs)
    greedy = json.loads(_cli(*base).stdout)
    assert greedy["sampling_mode"] == "greedy"


def test_cli_bad_sampling_mode_exits_2_with_one_line(tiny):
    p = tiny("llama")
    r = _cli("-m", str(p.target), "-p", "x", "--temp", "0.7", "--sampling-mode", "typical")
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "--sampling-mode" in lines[0] and "Traceback" not in r.stderr


def test_server_body_sampling_mode_reaches_the_request():
    """The server's extension field: validated by the schema (bad values are 400s, test_server_badinput) and
    passed to the engine Request; absent means rejection."""
    from pydflash.server.completions import Completions
    from pydflash.server.schemas import ChatCompletionRequest, CompletionRequest

    gen = Completions.__new__(Completions)  # _request reads only the body when it carries max_tokens
    for mode in ("match", "rejection"):
        body = CompletionRequest.model_validate(
            {"prompt": "x", "max_tokens": 4, "temperature": 0.7, "seed": 3, "sampling_mode": mode})
        req = gen._request([5, 6], body, {})
        assert (req.sampling_mode, req.temperature, req.seed) == (mode, 0.7, 3)
    chat = ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
    assert chat.sampling_mode == "rejection" and gen._request([5], chat, {}).rejection  # OpenAI's default T is 1


def test_the_proposal_follows_row_0_acceptance():
    """Row 0's rates from the two rows on the host, and the choice they drive: a drafter more confident than the
    target is sampled from; a less confident one (the shipped pair at 0.7) drafts its argmax."""
    from pydflash.engine import proposal

    p = (None, np.array([0.1, 0.5, 0.4], dtype=np.float32))
    confident = (np.array([1, 2], dtype=np.int32), np.array([0.5, 0.5], dtype=np.float32))  # a top-k row
    s_rate, a_rate = proposal.row0_rates(p, confident, 3)
    assert s_rate == pytest.approx(0.9) and a_rate == pytest.approx(0.5)
    assert proposal.argmax_of(confident) == 1 and proposal.argmax_of(None) is None
    assert proposal.row0_rates(None, confident, 3) is None

    chooser = proposal.Proposal()
    assert chooser.argmax  # before any step: llama.cpp's sample-and-match
    chooser.observe((s_rate, a_rate))
    assert not chooser.argmax
    for _ in range(30):  # the drafter turns flat where the target is sure: argmax wins within a few steps
        chooser.observe(proposal.row0_rates((None, np.array([0.0, 0.9, 0.1], dtype=np.float32)),
                                            (None, np.array([0.3, 0.36, 0.34], dtype=np.float32)), 3))
    assert chooser.argmax
    chooser.observe(None)  # an unreadable row changes nothing
    assert chooser.argmax
