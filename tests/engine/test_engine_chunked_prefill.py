"""Chunked prefill: a long prompt goes through the target n_batch tokens per step, in the same forward
as the running slots' verify spans, so running streams keep receiving tokens, and output stays lossless."""

from __future__ import annotations

import math

import pytest

from tests.helpers.oracle import Oracle
from pydflash import api
from pydflash.config import EngineConfig
from pydflash.engine.request import Request

SHORT = ["hello world, the quick brown fox", "def add(a, b):\n    return a + b\n"]
LONG = " ".join(["Once upon a time there was a longer prompt about nothing in particular."] * 12)


@pytest.fixture(scope="module", params=["gemma3", "qwen3"])
def arch_pair(request, tiny):
    p = tiny(request.param)
    oracle = Oracle(p.target)
    yield p, oracle
    oracle.close()


def spec_llm(p, **cfg):
    cfg.setdefault("n_ctx_slot", 1024)
    return api.load(p.target, p.drafter, config=EngineConfig(**cfg))


@pytest.mark.parametrize("adaptive", [False, True])
def test_long_prompt_joins_running_requests_lossless(arch_pair, adaptive):
    """A prompt longer than 2 x n_ubatch (and than n_batch) arrives while two requests are mid-generation."""
    p, oracle = arch_pair
    with spec_llm(p, n_slots=3, n_batch=64, n_ubatch=32, adaptive=adaptive) as llm:
        eng = llm.engine
        long_toks = llm.tokenize(LONG)
        assert len(long_toks) > 2 * 64
        first = [Request(llm.tokenize(s), max_tokens=40, ignore_eos=True) for s in SHORT]
        late = Request(long_toks, max_tokens=30, ignore_eos=True)
        results = {}
        eng.submit_all(first)
        for step in range(500):
            if step == 3:
                eng.submit(late)
            for ev in eng.step():
                if ev.finished:
                    results[ev.request_id] = ev.result
            if not eng.has_work:
                break
    for r in first + [late]:
        assert len(results[r.id].tokens) == r.max_tokens
        oracle.check(r.prompt, results[r.id].tokens)
    assert results[late.id].stats.n_drafted > 0


def test_running_stream_gets_tokens_while_a_long_prompt_prefills(tiny):
    p = tiny("qwen3")
    n_batch = 64
    with spec_llm(p, n_slots=2, n_batch=n_batch, n_ubatch=32) as llm:
        eng = llm.engine
        runner = Request(llm.tokenize(SHORT[0]), max_tokens=200, ignore_eos=True)
        eng.submit(runner)
        for _ in range(2):
            eng.step()
        long_toks = llm.tokenize(LONG)
        late = Request(long_toks, max_tokens=5, ignore_eos=True)
        eng.submit(late)
        steps = chunk_steps = 0
        while True:
            events = eng.step()
            steps += 1
            got = {ev.request_id for ev in events}
            assert runner.id in got  # the running stream is never frozen by the prefill
            if late.id in got:
                break
            slot = next(s for s in eng.slots if s is not None and s.request.id == late.id)
            assert len(slot.prefill) + slot.n_past == len(long_toks) - 1
            assert slot.n_past <= steps * n_batch  # at most n_batch prompt tokens per step
            chunk_steps += slot.n_past > 0
    # the prompt (but its last token) went through in chunks of at most n_batch, one per step, then one verify step
    assert chunk_steps >= math.ceil((len(long_toks) - 1) / n_batch) >= 3
    assert steps == chunk_steps + 1


def test_prefill_chunks_fill_the_batch_oldest_first(tiny):
    """Two long prompts admitted together: the older one gets the batch first; at most n_batch tokens each."""
    p = tiny("llama")
    with spec_llm(p, n_slots=2, n_batch=48, n_ubatch=48) as llm:
        eng = llm.engine
        toks = llm.tokenize(LONG)
        a, b = Request(toks, max_tokens=3, ignore_eos=True), Request(toks[:100], max_tokens=3, ignore_eos=True)
        eng.submit_all([a, b])
        eng.step()
        sa, sb = eng.slots
        assert sa.n_past == 48 and sb.n_past == 0  # the target's n_batch is 48 here (2 slots x block <= 48)
        assert eng.target_ctx.seq_pos_max(sa.seq) == 47 and eng.target_ctx.seq_pos_max(sb.seq) == -1
        res = eng.run([])
        assert not eng.has_work
    oracle = Oracle(p.target)
    try:
        for r in (a, b):
            oracle.check(r.prompt, res[r.id].tokens)
    finally:
        oracle.close()


def test_cancel_while_prefilling_frees_the_slot(tiny):
    """With the prompt cache off, nothing of a cancelled prefill stays (with it on, the prefilled part is kept for
    reuse: tests/cache/test_cache_engine.py)."""
    from pydflash.cache.config import CacheConfig

    p = tiny("qwen3")
    with api.load(p.target, p.drafter, config=EngineConfig(n_ctx_slot=1024, n_batch=32, n_ubatch=32),
                  cache=CacheConfig(reuse=False, ram_mib=0)) as llm:
        eng = llm.engine
        req = Request(llm.tokenize(LONG), max_tokens=4, ignore_eos=True)
        eng.submit(req)
        assert eng.step() == []  # the first chunk only: no token yet
        slot = eng.slots[0]
        assert not slot.prefilled and slot.n_past == 32
        assert eng.cancel(req.id)
        assert not eng.has_work
        assert eng.target_ctx.seq_pos_max(0) == -1 and eng.drafter.ctx.seq_pos_max(0) == -1
        assert len(llm.generate("hello", max_tokens=3, ignore_eos=True).tokens) == 3
