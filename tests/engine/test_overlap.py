"""Host work hidden behind the device: the drafter's noise blocks leave its KV while the target's verify forward
runs (Engine._while_verifying), the target's rollbacks leave its KV while the drafter's next forward runs, and
output and KV bookkeeping stay exact."""

from __future__ import annotations

from pydflash import api
from pydflash.config import EngineConfig
from pydflash.engine.request import Request

PROMPTS = ("hello world", "def f(x):", "1, 2, 3,")


def plain_outputs(p) -> list[list[int]]:
    with api.load(p.target, config=EngineConfig(n_ctx_slot=512, n_slots=3)) as plain:
        return [plain.generate(plain.tokenize(t), max_tokens=48, ignore_eos=True).tokens for t in PROMPTS]


def flag_inside(ctx, inside: list) -> None:
    """Wrap a context's decode so that inside[0] holds while it runs (its ``during`` included)."""
    decode = ctx.decode

    def wrapped(batch, during=None):
        inside[0] = True
        try:
            decode(batch, during)
        finally:
            inside[0] = False

    ctx.decode = wrapped


def test_noise_blocks_leave_the_drafter_kv_during_the_verify(tiny):
    p = tiny("gemma3")
    base = plain_outputs(p)
    cfg = EngineConfig(n_ctx_slot=512, n_slots=3, check_invariants=True)  # a fixed block every step
    with api.load(p.target, p.drafter, config=cfg) as llm:
        eng = llm.engine
        inside, drops = [False], []  # drops: (inside the target forward, noise blocks still written)
        flag_inside(eng.target_ctx, inside)
        drop = eng.drafter.drop_blocks

        def drop_blocks():
            drops.append((inside[0], len(eng.drafter._written)))
            drop()

        eng.drafter.drop_blocks = drop_blocks
        out = llm.generate_many([Request(llm.tokenize(t), max_tokens=48, ignore_eos=True) for t in PROMPTS])
    assert [r.tokens for r in out] == base  # check_invariants held the drafter KV to its bookkeeping every step
    dropped = [d for d in drops if d[1]]
    assert dropped and all(inside for inside, _ in dropped), drops


def test_target_rollbacks_run_during_the_next_drafter_forward(tiny):
    """A step's rejected positions leave the target KV while the next step's drafter forward runs (queued by
    ``seq_rm_later``, made in its ``during``), not in the commit; output stays plain greedy's. Without invariant
    checks: they read the KV after each commit, which makes the queued rollbacks at once."""
    p = tiny("gemma3")
    base = plain_outputs(p)
    with api.load(p.target, p.drafter, config=EngineConfig(n_ctx_slot=512, n_slots=3, check_invariants=False)) as llm:
        eng = llm.engine
        inside, rms = [False], []  # rms: inside the drafter's forward, for each target rollback made
        flag_inside(eng.drafter.ctx, inside)
        seq_rm = eng.target_ctx._seq_rm

        housekeeping = [False]  # the prompt cache holding idle slots to its budget: no rollback

        def target_seq_rm(seq, p0, p1):
            if not housekeeping[0]:
                rms.append(inside[0])
            seq_rm(seq, p0, p1)

        hold = eng.prompt_cache._hold_to_budget

        def held():
            housekeeping[0] = True
            try:
                hold()
            finally:
                housekeeping[0] = False

        eng.target_ctx._seq_rm = target_seq_rm
        eng.prompt_cache._hold_to_budget = held
        out = llm.generate_many([Request(llm.tokenize(t), max_tokens=48, ignore_eos=True) for t in PROMPTS])
    assert [r.tokens for r in out] == base
    # all but those left at a request's end (made when its slot is released) ran inside the drafter forward
    assert len(rms) > 20 and sum(rms) >= len(rms) - 3 * len(PROMPTS), rms


def test_a_queued_rollback_is_made_before_the_kv_is_read(tiny):
    p = tiny("gemma3")
    with api.load(p.target, config=EngineConfig(n_ctx_slot=256, n_slots=2)) as llm:
        ctx = llm.engine.target_ctx
        llm.generate(llm.tokenize("hello world"), max_tokens=8, ignore_eos=True)
        end = ctx.seq_pos_max(0)
        assert end > 4
        ctx.seq_rm_later(0, 3)
        assert ctx.seq_pos_max(0) == 2 and not ctx._later
        ctx.seq_rm_later(0, 1)
        ctx.clear()  # nothing is left to remove them from: the queue goes with the KV
        assert not ctx._later and ctx.seq_pos_max(0) == -1
