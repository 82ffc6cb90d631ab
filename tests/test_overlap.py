"""Host work hidden behind the device: the drafter's noise blocks leave its KV while the target's verify forward
runs (Engine._while_verifying), and output and KV bookkeeping stay exact."""

from __future__ import annotations

from pydflash import api
from pydflash.config import EngineConfig
from pydflash.engine.request import Request


def test_noise_blocks_leave_the_drafter_kv_during_the_verify(tiny):
    p = tiny("gemma3")
    with api.load(p.target, config=EngineConfig(n_ctx_slot=512, n_slots=3)) as plain:
        prompts = [plain.tokenize(t) for t in ("hello world", "def f(x):", "1, 2, 3,")]
        base = [plain.generate(t, max_tokens=48, ignore_eos=True).tokens for t in prompts]
    cfg = EngineConfig(n_ctx_slot=512, n_slots=3, check_invariants=True)  # a fixed block every step
    with api.load(p.target, p.drafter, config=cfg) as llm:
        eng = llm.engine
        inside, drops = [False], []  # drops: (inside the target forward, noise blocks still written)
        decode, drop = eng.target_ctx.decode, eng.drafter.drop_blocks

        def target_decode(batch, during=None):
            inside[0] = True
            try:
                decode(batch, during)
            finally:
                inside[0] = False

        def drop_blocks():
            drops.append((inside[0], len(eng.drafter._written)))
            drop()

        eng.target_ctx.decode, eng.drafter.drop_blocks = target_decode, drop_blocks
        out = llm.generate_many([Request(t, max_tokens=48, ignore_eos=True) for t in prompts])
    assert [r.tokens for r in out] == base  # check_invariants held the drafter KV to its bookkeeping every step
    dropped = [d for d in drops if d[1]]
    assert dropped and all(inside for inside, _ in dropped), drops
