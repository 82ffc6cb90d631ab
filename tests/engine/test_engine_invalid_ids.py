"""llama.cpp never receives a token id outside the vocabulary.

On the GPU a drafter can yield id -1 for a draft (CUDA's argmax over a row of NaN/-inf logits, or a row the backend
sampler left unsampled). Put into the verify batch, llama.cpp reads -1 as "no token" and fails every step with
"all entries in the batch must have the same content types". The CPU argmax never returns -1, so these tests
inject the -1 where the GPU produces it: the drafter's (or the target's) picks.
"""

from __future__ import annotations

import pytest

from tests.helpers.oracle import Oracle
from pydflash import api
from pydflash.config import EngineConfig
from pydflash.engine.request import Request
from pydflash.errors import DecodeError, InvalidBatch
from pydflash.native import TokenBatch

PROMPT = "def add(a, b):\n    return a + b\n"


def test_decode_refuses_an_invalid_token_id(pair):
    with api.load(pair.target, config=EngineConfig(n_ctx_slot=128)) as llm:
        ctx = llm.engine.target_ctx
        b = TokenBatch(8)
        for bad in (-1, ctx.n_vocab):
            b.clear()
            b.add([5, 6, bad, 7], 0, 0, True)
            with pytest.raises(InvalidBatch, match="outside the vocabulary") as exc:
                ctx.decode(b)
            assert isinstance(exc.value, DecodeError) and exc.value.code == -1
            assert "batch index 2" in str(exc.value) and "sequence 0" in str(exc.value)
        assert ctx.seq_pos_max(0) == -1  # nothing was decoded
        assert len(llm.generate("hello", max_tokens=3, ignore_eos=True).tokens) == 3


def test_drafts_of_minus_one_are_cut_and_output_stays_exact(pair):
    oracle = Oracle(pair.target)
    with api.load(pair.target, pair.drafter, config=EngineConfig(n_slots=2, n_ctx_slot=256)) as llm:
        dctx, b = llm.engine.drafter.ctx, llm.engine.drafter.batch
        real = dctx.picks

        def gpu_like(indices):  # the GPU's -1 from the third draft of every block on (block row 0 is the anchor)
            first = {}
            for i in range(b.n):
                first.setdefault(b.seq_of(i), i)
            return [t if i - first[b.seq_of(i)] <= 2 else -1 for i, t in zip(indices, real(indices))]

        dctx.picks = gpu_like
        toks = llm.tokenize(PROMPT)
        results = llm.generate_many([
            Request(toks, max_tokens=24, ignore_eos=True), Request(toks[:5], max_tokens=17, ignore_eos=True)])
        assert llm.engine.drafter.n_invalid > 0
    for res, prompt in zip(results, [toks, toks[:5]]):
        assert res.stats.n_drafted > 0
        assert res.stats.n_drafted <= 2 * res.stats.n_draft_steps  # blocks were cut at the -1
        oracle.check(prompt, res.tokens)
    oracle.close()


def test_a_target_pick_of_minus_one_is_an_error_not_a_token(pair):
    with api.load(pair.target, pair.drafter, config=EngineConfig(n_ctx_slot=256)) as llm:
        tctx = llm.engine.target_ctx
        tctx.picks = lambda indices: [-1 for _ in indices]
        with pytest.raises(InvalidBatch, match="target returned token id -1"):
            llm.generate("hello", max_tokens=8, ignore_eos=True)
