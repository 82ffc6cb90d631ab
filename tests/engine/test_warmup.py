"""The load-time warm-up (engine/warmup.py): it runs each context's largest batch, leaves both KV caches empty, and
changes no output."""

from __future__ import annotations

from pydflash import api
from pydflash.config import EngineConfig
from pydflash.engine.request import Request


def test_warm_up_leaves_empty_caches_and_the_same_output(tiny):
    p = tiny("gemma3")
    outs, decodes = {}, {}
    for warm in (False, True):
        cfg = EngineConfig(n_ctx_slot=256, n_slots=3, check_invariants=True, warm_up=warm)
        with api.load(p.target, p.drafter, config=cfg) as llm:
            eng = llm.engine
            decodes[warm] = (eng.target_ctx.n_decodes, eng.drafter.ctx.n_decodes)
            for ctx in (eng.target_ctx, eng.drafter.ctx):
                assert all(ctx.seq_pos_max(s) == -1 for s in range(3))
            toks = [llm.tokenize(t) for t in ("hello world", "def f(x):", "1, 2, 3,")]
            outs[warm] = [r.tokens for r in llm.generate_many([Request(t, max_tokens=32, ignore_eos=True)
                                                                   for t in toks])]
    assert decodes[False] == (0, 0) and decodes[True][0] >= 2 and decodes[True][1] >= 1
    assert outs[True] == outs[False]


def test_warm_up_is_off_on_a_cpu_by_default(tiny):
    p = tiny("llama")
    with api.load(p.target, p.drafter, config=EngineConfig(n_ctx_slot=128)) as llm:
        assert llm.engine.warm_up_s == 0.0 and llm.engine.target_ctx.n_decodes == 0


def test_warm_up_fits_kv_streams(tiny):
    """A KV stream per slot holds n_ctx_slot cells: the warm-up's prompt chunk must fit one (training-data
    generation runs 100+ slots this way on a GPU)."""
    p = tiny("llama")
    cfg = EngineConfig(n_ctx_slot=64, n_slots=4, n_batch=512, kv_unified=False, draft_max=0, warm_up=True)
    with api.load(p.target, config=cfg) as llm:
        assert llm.engine.warm_up_s > 0
        assert llm.generate(llm.tokenize("hello"), max_tokens=8, ignore_eos=True).tokens
