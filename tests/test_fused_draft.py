"""patches/0006: a drafter batch whose rows carry both a token and target features injects the rows that are not
outputs and runs the noise block on the output rows, in one forward.

The fused forward must leave exactly what the two forwards it replaces leave: the same block logits, and the same
K/V in the drafter cache (read back through the next block, which attends to them). Without the patch a token +
embd batch is taken for a plain injection: no logits, and a test here fails at the first read.
"""

from __future__ import annotations

import numpy as np
import pytest

from pydflash.native import Context, ContextParams, TokenBatch
from pydflash.pair import load_pair

N_PROMPT = 12


@pytest.fixture(scope="module")
def setup(tiny):
    p = tiny("gemma3")  # Gemma: the drafter scales its noise embeddings, so both paths must agree on that too
    pair = load_pair(p.target, p.drafter)
    assert pair.fused_drafts
    yield pair
    pair.close()


def contexts(pair):
    params = ContextParams(n_ctx=256, n_batch=64, n_ubatch=64, n_seq_max=2, backend_greedy=False)
    tctx = Context(pair.target, ContextParams(n_ctx=256, n_batch=64, n_ubatch=64, n_seq_max=2,
                                              feature_layers=tuple(pair.feature_layers)))
    dctx = Context(pair.drafter, params, ctx_other=tctx, causal=False)
    return tctx, dctx


def features(pair, tctx, seq, tokens):
    b = TokenBatch(64)
    b.add(tokens, 0, seq, False)
    tctx.decode(b)
    return tctx.features(len(tokens)).copy()


def block_logits(dctx, b, starts, k):
    return [np.stack([dctx.logits(s + i) for i in range(k + 1)]) for s in starts]


def test_fused_forward_equals_inject_then_block(setup):
    """Two sequences, context rows of different lengths: the fused forward's block logits are the two-forward
    path's, and so are the next blocks' (which read the context rows' K/V from the cache)."""
    pair = setup
    width = len(pair.feature_layers) * pair.target.n_embd
    vocab = pair.target.n_vocab
    prompts = [[(i * 7 + 3 + 5 * s) % (vocab - 16) + 8 for i in range(N_PROMPT)] for s in range(2)]
    ctx_rows = [4, 9]  # features of the last rows of each prompt go in with the block; the rest before it
    k = 7
    anchors = [prompts[s][-1] for s in range(2)]
    mask = pair.mask_token

    results = {}
    for mode in ("separate", "fused"):
        tctx, dctx = contexts(pair)
        feats = [features(pair, tctx, s, prompts[s]) for s in range(2)]
        # positions before the ones injected with the block: an ordinary injection in both modes
        for s in range(2):
            n0 = N_PROMPT - ctx_rows[s]
            dctx.inject(feats[s][:n0], np.arange(n0, dtype=np.int32), np.full(n0, s, dtype=np.int32))
        if mode == "separate":
            for s in range(2):
                n0 = N_PROMPT - ctx_rows[s]
                dctx.inject(feats[s][n0:], np.arange(n0, N_PROMPT, dtype=np.int32), np.full(ctx_rows[s], s, np.int32))
            b = TokenBatch(64)
            starts = [b.add([anchors[s]] + [mask] * k, N_PROMPT, s, True) for s in range(2)]
        else:
            b = TokenBatch(64, width)
            starts = []
            for s in range(2):
                n0 = N_PROMPT - ctx_rows[s]
                first = b.add([mask] * ctx_rows[s], n0, s, False)
                b.embd[first : first + ctx_rows[s]] = feats[s][n0:]
                starts.append(b.add([anchors[s]] + [mask] * k, N_PROMPT, s, True))
        dctx.decode(b)
        first_blocks = block_logits(dctx, b, starts, k)
        for s in range(2):
            dctx.seq_rm(s, N_PROMPT)
        assert [dctx.seq_pos_max(s) for s in range(2)] == [N_PROMPT - 1] * 2  # the context rows stayed
        # the next block (a plain token batch in both modes) attends to whatever the first forward left
        b2 = TokenBatch(64)
        starts2 = [b2.add([anchors[s]] + [mask] * k, N_PROMPT, s, True) for s in range(2)]
        dctx.decode(b2)
        results[mode] = (first_blocks, block_logits(dctx, b2, starts2, k))
        dctx.close()
        tctx.close()

    for which in range(2):
        for s in range(2):
            sep, fus = results["separate"][which][s], results["fused"][which][s]
            np.testing.assert_allclose(fus, sep, rtol=1e-4, atol=1e-4 * np.abs(sep).max())
            assert np.array_equal(fus.argmax(axis=1), sep.argmax(axis=1))


def test_engine_drafts_in_one_forward_per_step(setup, monkeypatch):
    """Steady drafting takes one drafter forward per step (injection fused in); PYDFLASH_SEPARATE_INJECTION keeps
    two. The output is the same either way (the plain greedy oracle is tests/test_engine_lossless.py's)."""
    from pydflash.config import EngineConfig
    from pydflash.engine.engine import Engine
    from pydflash.engine.request import Request

    pair = setup
    out = {}
    for separate in (False, True):
        if separate:
            monkeypatch.setenv("PYDFLASH_SEPARATE_INJECTION", "1")
        eng = Engine(pair, EngineConfig(n_slots=2, n_ctx_slot=512, draft_max=6, seed=0))
        assert (eng.drafter.fused_batch is None) == separate
        reqs = [Request([(i * 5 + 9 + 3 * s) % (pair.target.n_vocab - 16) + 8 for i in range(20)],
                        max_tokens=40, ignore_eos=True) for s in range(2)]
        calls = {"inject": 0, "decode": 0}
        for name in calls:
            def counted(*a, _f=getattr(eng.drafter.ctx, name), _n=name):
                calls[_n] += 1
                return _f(*a)
            setattr(eng.drafter.ctx, name, counted)
        results = eng.run(reqs)
        out[separate] = [results[r.id].tokens for r in reqs]
        eng.close()
        assert calls["decode"] > 10  # drafting steps (a block forward each)
        # an injection forward per drafting step unless fused, where only each prompt's rows (catch-up) go alone
        if separate:
            assert calls["inject"] >= calls["decode"], calls
        else:
            assert calls["inject"] <= len(reqs), calls
    assert out[False] == out[True]
