"""EOS, stop strings and max_tokens falling inside an accepted block: nothing past them is emitted."""

from __future__ import annotations

from tests.helpers.oracle import Oracle
from pydflash import api
from pydflash.config import EngineConfig

PROMPT = "def add(a, b):\n    return a + b\n"


def synth_all(p, **kw):
    k = p.block_size - 1
    return api.load(p.target, p.drafter, config=EngineConfig(n_ctx_slot=1024, synth_len=float(k + 1)), **kw)


def test_eos_inside_an_accepted_block(tiny):
    p = tiny("qwen3")
    k = p.block_size - 1
    with synth_all(p) as llm:
        toks = llm.tokenize(PROMPT)
        full = llm.generate(toks, max_tokens=4 * (k + 1), ignore_eos=True).tokens
    # a token inside an accepted block (not a block's bonus, position k of each block of k + 1) that does not
    # occur before it, the later the better; the first token always qualifies
    inside = [j for j in range(len(full)) if j % (k + 1) != k and full[j] not in full[:j]]
    j = inside[-1]
    with synth_all(p, target_kv_overrides={"tokenizer.ggml.eos_token_id": full[j]}) as llm:
        res = llm.generate(toks, max_tokens=4 * (k + 1))
    assert res.finish_reason == "stop"
    assert res.tokens == full[:j]  # EOS itself and everything after it in the block are dropped


def test_stop_string_inside_an_accepted_block(tiny):
    p = tiny("qwen3")
    k = p.block_size - 1
    with synth_all(p) as llm:
        toks = llm.tokenize(PROMPT)
        full = llm.generate(toks, max_tokens=3 * (k + 1), ignore_eos=True)
        text = full.text
        # a stop string taken from the middle of the generated text
        mid = len(text) // 2
        stop = text[mid : mid + 3]
        cut = text.find(stop)
        events = list(llm.stream(toks, max_tokens=3 * (k + 1), ignore_eos=True, stop=[stop]))
    res = events[-1].result
    assert res.finish_reason == "stop"
    assert res.text == text[:cut]
    assert "".join(ev.text for ev in events) == text[:cut]
    assert len(res.tokens) < len(full.tokens)


def test_max_tokens_inside_an_accepted_block(tiny):
    p = tiny("qwen3")
    k = p.block_size - 1
    with synth_all(p) as llm:
        res = llm.generate(llm.tokenize(PROMPT), max_tokens=k + 4, ignore_eos=True)
    assert len(res.tokens) == k + 4
    assert res.finish_reason == "length"


def test_stop_string_matches_plain_greedy(tiny):
    """With a real (non-synthetic) drafter, spec + stop string == plain + stop string."""
    p = tiny("llama")
    oracle = Oracle(p.target)
    toks = oracle.llm.tokenize(PROMPT)
    base = oracle.llm.generate(toks, max_tokens=40, ignore_eos=True)
    stop = base.text[len(base.text) // 3 :][:2]
    plain = oracle.llm.generate(toks, max_tokens=40, ignore_eos=True, stop=[stop])
    with api.load(p.target, p.drafter, config=EngineConfig(n_ctx_slot=1024)) as llm:
        spec = llm.generate(toks, max_tokens=40, ignore_eos=True, stop=[stop])
    assert spec.text == plain.text and spec.tokens == plain.tokens
    assert spec.finish_reason == plain.finish_reason == "stop"
    oracle.close()


def test_no_drafts_past_max_tokens(tiny):
    """Every draft accepted (synthetic), max_tokens 4 past the first block: the second step verifies the 3 drafts
    that max_tokens lets out, not a whole block whose tail would be verified only to be cut (so draft_n_accepted
    never counts tokens that were not emitted). The drafter still drafts its whole block: a DFlash block is
    non-causal, and a shorter one drafts its first tokens worse."""
    p = tiny("qwen3")
    k = p.block_size - 1
    with synth_all(p) as llm:
        drafter, blocks = llm.engine.drafter, []
        propose = drafter.propose
        drafter.propose = lambda plan, **kw: (blocks.append([n for _, n in plan if n]), propose(plan, **kw))[1]
        res = llm.generate(llm.tokenize(PROMPT), max_tokens=k + 5, ignore_eos=True)
    assert [b for b in blocks if b] == [[k], [k]]  # (the prefill step only injects)
    assert len(res.tokens) == k + 5
    assert res.stats.n_steps == 2
    assert res.stats.n_drafted == res.stats.n_accepted == k + 3
    assert res.stats.n_generated - res.stats.n_accepted == res.stats.n_steps
