"""Speculative output equals plain greedy output on the same engine (regret gate for float near-ties)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.helpers.oracle import Oracle
from pydflash import api
from pydflash.config import EngineConfig
from pydflash.engine.request import Request
from pydflash.errors import InvariantError

PROMPTS = [
    "hello world, the quick brown fox",
    "def add(a, b):\n    return a + b\n",
    "Once upon a time there was",
    "1, 2, 3, 4, 5, 6,",
    "the the the",
    "zq",
    "A longer prompt about nothing in particular, written so that it spans several tokens.",
    "x = [i * i for i in range(10)]",
]


@pytest.fixture(scope="module", params=["llama", "qwen3", "gemma3"])
def arch_pair(request, tiny):
    p = tiny(request.param)
    oracle = Oracle(p.target)
    yield p, oracle
    oracle.close()


def spec_llm(p, **cfg):
    cfg.setdefault("n_ctx_slot", 2048)
    return api.load(p.target, p.drafter, config=EngineConfig(**cfg))


def test_single_slot_lossless(arch_pair):
    p, oracle = arch_pair
    with spec_llm(p) as llm:
        for prompt in PROMPTS[:4]:
            toks = llm.tokenize(prompt)
            res = llm.generate(toks, max_tokens=48, ignore_eos=True)
            assert len(res.tokens) == 48
            oracle.check(toks, res.tokens)
            assert res.stats.n_drafted > 0  # speculation really ran


def test_eight_slots_staggered_lossless(arch_pair):
    """8 concurrent slots, different prompt lengths, staggered max_tokens (3 ends mid-block next to long ones)."""
    p, oracle = arch_pair
    max_tokens = [3, 40, 17, 64, 1, 33, 9, 50]
    with spec_llm(p, n_slots=8) as llm:
        reqs = [Request(llm.tokenize(pr), max_tokens=n, ignore_eos=True) for pr, n in zip(PROMPTS, max_tokens)]
        results = llm.generate_many(reqs)
    for req, res, n in zip(reqs, results, max_tokens):
        assert len(res.tokens) == n
        assert res.finish_reason == "length"
        oracle.check(req.prompt, res.tokens)


def test_requests_join_and_leave_mid_flight(tiny):
    p = tiny("qwen3")
    oracle = Oracle(p.target)
    with spec_llm(p, n_slots=3) as llm:
        eng = llm.engine
        first = Request(llm.tokenize(PROMPTS[0]), max_tokens=30, ignore_eos=True)
        eng.submit(first)
        results, later = {}, []
        for step in range(200):
            if step in (2, 5, 9):  # join while others are mid-generation
                r = Request(llm.tokenize(PROMPTS[step % len(PROMPTS)]), max_tokens=7 + step, ignore_eos=True)
                eng.submit(r)
                later.append(r)
            for ev in eng.step():
                if ev.finished:
                    results[ev.request_id] = ev.result
            if not eng.has_work and step > 9:
                break
    for r in [first] + later:
        oracle.check(r.prompt, results[r.id].tokens)
    oracle.close()


def test_prompt_longer_than_two_ubatches(tiny):
    """Prefill spanning many ubatches keeps every feature row (n_ubatch 32, prompt > 64 tokens)."""
    p = tiny("gemma3")
    oracle = Oracle(p.target)
    with spec_llm(p, n_batch=64, n_ubatch=32) as llm:
        toks = llm.tokenize(" ".join(PROMPTS) * 2)
        assert len(toks) > 2 * 64
        res = llm.generate(toks, max_tokens=40, ignore_eos=True)
        slot_rows = res.stats.n_prompt
        assert slot_rows == len(toks)
        oracle.check(toks, res.tokens)
    oracle.close()


def test_reject_everything_leaks_no_kv(tiny):
    """synth_len 1: every draft rejected, only bonus tokens commit (= plain greedy). 20 requests, then no cell left."""
    p = tiny("llama")
    oracle = Oracle(p.target)
    with spec_llm(p, n_slots=2, n_ctx_slot=256, synth_len=1.0) as llm:
        eng = llm.engine
        reqs = [Request(llm.tokenize(PROMPTS[i % 8]), max_tokens=20 + i, ignore_eos=True) for i in range(20)]
        results = llm.generate_many(reqs)
        for req, res in zip(reqs, results):
            assert res.stats.n_accepted == 0 and res.stats.n_drafted > 0
            # one genuine near-tie may flip (an AVX2 host met one at 0.007 nat in these 20 requests); the gate
            # still holds every divergence to 0.2 nat
            oracle.check(req.prompt, res.tokens, max_flips=1)
        for seq in range(2):  # each slot holds its kept sequence (prompt cache) and nothing else
            kept = eng.prompt_cache.resident[seq]
            held = kept.n - 1 if kept is not None else -1
            assert eng.target_ctx.seq_pos_max(seq) == held
            assert eng.drafter.ctx.seq_pos_max(seq) == (kept.features.drafter_len - 1 if kept is not None else -1)
        # the whole unified cache is free again: a request filling a slot's window still fits
        big = llm.generate(llm.tokenize(PROMPTS[6])[:40], max_tokens=256 - 40 - eng.block_size, ignore_eos=True)
        assert big.finish_reason == "length"
    oracle.close()


def test_accept_everything_synthetic(tiny):
    """synth_len K+1: every draft accepted; invariants hold every step and tau is K+1 until the last step."""
    p = tiny("qwen3")
    k = p.block_size - 1
    with spec_llm(p, synth_len=float(k + 1)) as llm:
        res = llm.generate(llm.tokenize(PROMPTS[1]), max_tokens=5 * (k + 1), ignore_eos=True)
    assert res.synthetic
    assert res.stats.n_accepted == res.stats.n_drafted
    assert res.stats.n_steps == 5
    assert res.stats.mean_accept_len == pytest.approx(k + 1)


def test_misaligned_features_are_detected(tiny, monkeypatch):
    """Shifting the committed feature rows by one position trips the alignment check instead of silently
    degrading acceptance."""
    from pydflash.engine import engine as engine_mod

    p = tiny("qwen3")
    real = engine_mod.Slot.add_features

    def shifted(self, rows, positions):
        return real(self, rows, positions + 1 if len(positions) and self.generated else positions)

    monkeypatch.setattr(engine_mod.Slot, "add_features", shifted)
    with spec_llm(p) as llm:
        with pytest.raises(InvariantError):
            llm.generate(llm.tokenize(PROMPTS[0]), max_tokens=30, ignore_eos=True)


def test_drafter_kv_changed_behind_the_bookkeeping_is_detected(tiny):
    """The per-step drafter check is skipped while the drafter context saw no write (Engine._check); any write
    through the context, here a position removed mid-run, makes the next check look again and fail."""
    p = tiny("qwen3")
    with spec_llm(p, n_slots=2) as llm:
        e = llm.engine
        e.submit(Request(llm.tokenize(PROMPTS[0]), max_tokens=40, ignore_eos=True))
        for _ in range(4):
            e.step()
        slot = next(s for s in e.slots if s is not None)
        e._check(slot)  # holds, and is remembered
        e.drafter.ctx.seq_rm(slot.seq, slot.drafter_len - 1)
        with pytest.raises(InvariantError, match="drafter KV holds"):
            e._check(slot)


def test_paused_drafter_skips_the_drafter_kv_query(tiny, monkeypatch):
    """With a drafter that never drafts, the drafter KV is not queried in every step for every slot."""
    from pydflash.native import Context

    p = tiny("qwen3")
    calls = []
    real = Context.seq_pos_min
    monkeypatch.setattr(Context, "seq_pos_min", lambda self, seq: calls.append(seq) or real(self, seq))
    with spec_llm(p, n_slots=4) as llm:  # the requests opt out of drafting: the drafter KV never changes
        llm.generate_many([Request(llm.tokenize(q), max_tokens=24, ignore_eos=True, draft_max=0) for q in PROMPTS[:4]])
    assert 0 < len(calls) <= 8  # a query per slot after prefill, not 4 in each of the 24 steps


# A reported divergence: 8 requests on 4 slots, so later requests are admitted into slots freed mid-flight (the reported
# divergence: "Emoji: 😀" at generated token 5, 1.65 nat, in the step that admitted a request into a freed slot).
ADMISSION_PROMPTS = ["The history of the printing press begins", "def add(a, b):\n", "Once upon a time",
                     "1, 2, 3, 4, 5,", "Emoji: 😀", "The capital of France is", "import numpy as np\n",
                     "Hello, world!"]
ADMISSION_MAX_TOKENS = [3, 9, 4, 6, 10, 5, 8, 7]  # staggered: every later request joins a slot freed mid-flight


def run_admission_scenario(target, drafter, **cfg):
    with api.load(target, drafter, config=EngineConfig(n_slots=4, **cfg)) as llm:
        reqs = [Request(llm.tokenize(p), max_tokens=n, ignore_eos=True)
                for p, n in zip(ADMISSION_PROMPTS, ADMISSION_MAX_TOKENS)]
        results = llm.generate_many(reqs)
    return reqs, results


@pytest.mark.parametrize("arch", ["qwen3", "gemma3"])
def test_plain_decoding_in_per_slot_kv_streams(tiny, arch):
    """EngineConfig(kv_unified=False), a KV stream per slot for plain decoding at many slots (training-data
    generation): 8 staggered requests on 4 slots stay the target's greedy text, cached prefixes included; a drafter
    is refused."""
    p = tiny(arch)
    oracle = Oracle(p.target)
    reqs, results = run_admission_scenario(p.target, None, n_ctx_slot=512, kv_unified=False)
    for req, res in zip(reqs, results):
        assert len(res.tokens) == req.max_tokens
        oracle.check(req.prompt, res.tokens)
    with api.load(p.target, None, config=EngineConfig(n_slots=2, n_ctx_slot=512, kv_unified=False)) as llm:
        first = llm.tokenize(ADMISSION_PROMPTS[0]) * 3
        a = llm.generate(first, max_tokens=12, ignore_eos=True)
        longer = first + a.tokens  # a kept prefix: only the rest is prefilled, in the same stream
        b = llm.generate(longer, max_tokens=12, ignore_eos=True)
        assert b.stats.n_cached > 0
        oracle.check(longer, b.tokens)
    oracle.close()
    with pytest.raises(ValueError, match="plain decoding"):
        api.load(p.target, p.drafter, config=EngineConfig(kv_unified=False))


def test_eight_requests_on_four_slots_tiny(tiny):
    p = tiny("gemma3")
    oracle = Oracle(p.target)
    reqs, results = run_admission_scenario(p.target, p.drafter, n_ctx_slot=512)
    for req, res in zip(reqs, results):
        assert len(res.tokens) == req.max_tokens
        oracle.check(req.prompt, res.tokens)
    oracle.close()


@pytest.mark.real_model
def test_eight_requests_on_four_slots_default_pair(gemma_path):
    """The default pair (Gemma-3-270M Q4_K_M + the shipped drafter), the reported scenario. The band is 0.5 nat:
    plain decoding of the same batch already reaches ~0.3 nat against single-sequence forwards (Q4_K rounding)."""
    from pydflash.defaults import default_pair

    d = default_pair()
    oracle = Oracle(d.target)
    reqs, results = run_admission_scenario(d.target, d.drafter, n_ctx_slot=512)
    for req, res in zip(reqs, results):
        assert len(res.tokens) == req.max_tokens
        oracle.check(req.prompt, res.tokens, max_regret=0.5)
    assert sum(r.stats.n_drafted for r in results) > 0
    oracle.close()


def test_oracle_counts_no_flip_where_the_pick_is_the_forwards_own_argmax(tiny):
    """A baseline that rounded away from the oracle's own argmax (a batched run) is re-anchored without counting
    a flip against the speculative output; a pick that is not the argmax still counts."""
    from tests.helpers.oracle import Oracle

    p = tiny("qwen3")
    oracle = Oracle(p.target)
    try:
        prompt = oracle.llm.tokenize("hello world")
        greedy = oracle.greedy(prompt, 12)
        logits = oracle.logits_after(prompt + greedy[:3])
        other = int(np.argsort(logits)[-2])  # the runner-up at token 3
        # spec is the greedy text; the baseline took the runner-up at token 3: spec's pick has regret 0 there
        assert oracle.check(prompt, greedy, base_tokens=greedy[:3] + [other] + greedy[4:], max_regret=50) == 0
        assert oracle.regrets == [(3, 0.0)]
        # the other way round, the runner-up is a real flip (its regret is the logit gap)
        spec = greedy[:3] + [other] + oracle.greedy(prompt + greedy[:3] + [other], 8)
        assert oracle.check(prompt, spec, base_tokens=greedy, max_regret=50) == 1
    finally:
        oracle.close()
