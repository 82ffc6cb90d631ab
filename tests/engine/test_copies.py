"""Copies where the drafter does not draft (engine/copies.py): a slot whose text repeats verifies what followed the
same words before, with no drafter forward, while adaptive drafting pauses; what copies earn never teaches the
drafter's evidence, and the output stays the target's."""

from __future__ import annotations

from tests.helpers.oracle import Oracle
from pydflash import api
from pydflash.config import EngineConfig
from pydflash.engine.copies import CHECK_EVERY, MAX_TRIM, RECHECK, SHAPE_STEP, START_RATE, CopyPolicy, SlotCopies
from pydflash.engine.costs import StepCosts
from pydflash.engine.adaptive import DraftPolicy, Plan
from pydflash.engine.lookup import LONG_MATCH, Edge, History
from pydflash.engine.request import Request

LOOP = "the cat sat on the mat. the cat sat on the mat. the cat"  # the tiny qwen3 target's greedy text loops on it


def _costs(plain: float, per_token: float, up_to: int, n: int = 4) -> StepCosts:
    """Cost curves as an engine has them after calibration: features-on verifies of n slots measured from n to
    ``up_to`` tokens, and the pause's featureless plain step, each past its warm-up."""
    c = StepCosts(drop_first=False)
    for x in range(n, up_to + 1, 4):
        for _ in range(3):
            c.observe(n, x, True, plain * 1.05 + per_token * (x - n), 0, 0.0)
    for _ in range(3):
        c.observe(n, n, False, plain, 0, 0.0)
    return c


def test_a_long_match_is_a_candidate_a_short_one_is_not():
    text = list(range(100, 100 + LONG_MATCH + 3))
    looping = History(text + [7] + text[:LONG_MATCH])
    assert CopyPolicy.candidate(SlotCopies(), looping, 3) == text[LONG_MATCH:LONG_MATCH + 3]
    assert CopyPolicy.candidate(SlotCopies(), History(text + [7] + text[1:LONG_MATCH]), 3) == []  # one token short
    assert CopyPolicy.candidate(SlotCopies(), None, 3) == []
    assert CopyPolicy.candidate(SlotCopies(), History(text + text), 0) == []
    waiting = SlotCopies(wait=2)  # refused lately: not a candidate for two more steps
    assert [CopyPolicy.candidate(waiting, looping, 3) for _ in range(3)] == [[], [], text[LONG_MATCH:LONG_MATCH + 3]]


def test_copies_go_in_where_verify_tokens_are_cheap_and_not_where_each_costs_a_step():
    """On a GPU a verify token costs a few percent of a plain step (weights are read once for the batch): a fresh
    slot's copy goes in long. Where each costs what a plain step of 4 slots does per token, only high acceptance
    could pay, and the engine's start at START_RATE is not that."""
    cheap = CopyPolicy(_costs(plain=2e-3, per_token=2e-5, up_to=64))
    assert all(k >= 8 for k in cheap.choose(4, [(SlotCopies(), 15), (SlotCopies(), 15)], features=False))
    dear = CopyPolicy(_costs(plain=2e-3, per_token=2e-3 / 4, up_to=64))
    assert dear.choose(4, [(SlotCopies(), 15)], features=False) == [0]


def test_sizes_above_every_measured_verify_are_tried_at_the_largest_measured_price():
    """Only sizes up to 8 tokens were measured (a CPU's calibration, whose one steep late sample would extrapolate to
    a copy token costing more than a plain one): copies are priced at the largest measured size and tried, which
    measures them."""
    c = _costs(plain=40e-3, per_token=4e-3, up_to=8)
    for _ in range(3):
        c.observe(4, 8, True, 0.12, 0, 0.0)  # a slow sample at the top of the measured range
    assert c.verify(4, 64, False) > 0.6  # the last slope, extrapolated
    assert c.verify_floor(4, 64, False) <= 0.13
    assert CopyPolicy(c).choose(4, [(SlotCopies(), 15)] * 4, features=False) != [0, 0, 0, 0]


def test_the_featureless_curve_borrows_the_featured_shape_rather_than_scale_one_point():
    c = _costs(plain=2e-3, per_token=2e-5, up_to=64)
    # features off measured at x = n only: proportional extrapolation would give 16 x 2 ms at 64 tokens
    assert c.verify(4, 64, False) < 2e-3 + 64 * 2e-5 + 1e-4


def test_a_copy_step_batch_is_a_multiple_of_the_shape_step():
    """Graphs are reused per batch size: copies are lengthened where the chains and the batch allow, at the shortest
    copy first, else shortened by at most MAX_TRIM at the longest, else left; a slot never starts copying to fill a
    shape."""
    fit = CopyPolicy.fit_shape
    assert (SHAPE_STEP, MAX_TRIM) == (8, 2)
    assert fit(4, [5, 0, 9], [15, 15, 15], 100) == [10, 0, 10]  # 18 -> 24: the 5 grows to 9 first, then both
    assert fit(4, [5, 0, 9], [6, 10, 10], 100) == [5, 0, 7]  # the chains allow 2 more of 6: 18 -> 16 at the longest
    assert fit(4, [5, 0, 9], [15, 15, 15], 18) == [5, 0, 7]  # the batch's room beyond the 4 is 18: the same
    assert fit(8, [15], [15], 100) == [15]  # 23: 7 short of 24 with the chain at its end, 7 over 16: left
    assert fit(14, [1], [15], 1) == [1]  # no room to grow: left
    assert fit(16, [1], [15], 1) == [0]  # 17 -> 16: the copy goes, the step is the plain one
    assert fit(16, [0, 0], [15, 15], 100) == [0, 0]
    for base in range(1, 40):
        for ks in ([1, 2, 3], [15, 0, 0], [7, 7, 0], [15, 15, 15]):
            out = fit(base, ks, [15] * 3, 128)
            assert all(0 <= o <= 15 for o in out) and all(o == 0 for o, k in zip(out, ks) if k == 0)
            total = base + sum(ks)
            if total % SHAPE_STEP <= MAX_TRIM or -total % SHAPE_STEP <= sum(15 - k for k in ks if k):
                assert (base + sum(out)) % SHAPE_STEP == 0 or not any(out)
            else:
                assert out == ks


def _jump(plain: float = 1.4e-3, n: int = 4) -> StepCosts:
    """An H100 of the traces: at 4 slots a verify's first extra token costs a millisecond (a copy step of ~20 tokens
    4.0 ms, a plain step 1.4), each further one 0.06 ms."""
    c = StepCosts(drop_first=False)
    for x in [n + k for k in (0, 4, 8, 16, 32, 60) for _ in range(3)]:
        c.observe(n, x, True, plain * 1.05 + (1e-3 + 6e-5 * (x - n) if x > n else 0.0), 0, 0.0)
    for _ in range(3):
        c.observe(n, n, False, plain, 0, 0.0)
    return c


def test_one_looping_slot_among_four_copies_once_the_engine_has_seen_copies_pay():
    """The verify's jump makes one slot's copy pay at 4 slots only if it expects ~5 accepted drafts. An engine with
    no evidence tries a short copy all the same (a trial: nothing else teaches it); one whose copies were accepted
    (0.95, a loop) gives a new slot a long copy at once; one whose copies failed copies nothing at START_RATE odds."""
    fresh = CopyPolicy(_jump())
    trial = fresh.choose(4, [(SlotCopies(), 15)], features=False)[0]
    assert 0 < trial <= 6
    learned = CopyPolicy(_jump())
    looping = SlotCopies()
    for i in range(20):
        learned.observe(looping, 15, 13 if i % 7 == 0 else 15)
    assert learned.choose(4, [(SlotCopies(), 15)], features=False)[0] >= 8
    failed = CopyPolicy(_jump())
    for _ in range(5):
        failed.observe(SlotCopies(), 15, 2)
    assert failed.choose(4, [(SlotCopies(), 15)], features=False) == [0]


def test_failed_copies_stop_and_come_back_after_the_slot_sits_out():
    """A slot whose first copies failed sits out while the engine's copies pay elsewhere; its own evidence fades each
    refusal, and it tries again; an engine whose copies all failed tries again too, later."""
    policy = CopyPolicy(_costs(plain=2e-3, per_token=2e-4, up_to=64))
    for _ in range(10):
        policy.observe(SlotCopies(), 15, 15)  # the engine's evidence: copies pay
    counts = SlotCopies()
    for _ in range(6):
        policy.observe(counts, 15, 0)  # this slot's: rejected at once, six times
    assert policy.choose(4, [(counts, 15)], features=False) == [0]
    assert counts.wait == RECHECK - 1  # not asked again for a few steps
    refusals = 1
    while policy.choose(4, [(counts, 15)], features=False) == [0]:
        refusals += 1
        assert refusals < 100
    assert 3 <= refusals < 40  # not at once
    bad = CopyPolicy(_costs(plain=2e-3, per_token=2e-4, up_to=64))
    for _ in range(30):
        bad.observe(SlotCopies(), 15, 0)
    steps = 1
    while bad.choose(4, [(SlotCopies(), 15)], features=False) == [0]:
        steps += 1
        assert steps < 1000
    assert steps > 20
    assert bad.prior.accepted[0] / bad.prior.drafted[0] < START_RATE


def _run(target, drafter, prompts, n, lookup=True, n_slots=None):
    config = EngineConfig(n_ctx_slot=1024, n_slots=n_slots or len(prompts), adaptive=True, lookup=lookup)
    with api.load(target, drafter, config=config) as llm:
        engine = llm.engine
        seen = {"drafter": [], "copies": []}  # what each learns from: (drafts, accepted) per slot and step
        observe, observe_copy = engine.drafting.observe, engine.copies.observe if engine.copies else None
        engine.drafting.observe = lambda pol, k, m: (seen["drafter"].append((k, m)), observe(pol, k, m))
        if engine.copies is not None:
            engine.copies.observe = lambda c, k, m: (seen["copies"].append((k, m)), observe_copy(c, k, m))
        reqs = [Request(llm.tokenize(t), max_tokens=n, ignore_eos=True) for t in prompts]
        return reqs, llm.generate_many(reqs), seen


def test_a_looping_text_copies_while_a_useless_drafter_pauses(tiny):
    """The tiny random drafter never earns a pause's end, while the tiny qwen3 target's text loops: the loop is
    verified in copies, by several slots that take turns, and the text is plain greedy's."""
    p = tiny("qwen3")
    prompts = [LOOP, "hello world", LOOP + " sat on"]
    reqs, results, seen = _run(p.target, p.drafter, prompts, n=160, n_slots=2)
    oracle = Oracle(p.target)
    for req, res in zip(reqs, results):
        oracle.check(req.prompt, res.tokens)
    oracle.close()
    loops = [results[0].stats, results[2].stats]
    assert sum(st.n_lookup_accepted for st in loops) > 80 and sum(st.n_steps for st in loops) < 0.65 * 320, loops
    # each step with drafts taught either adaptive drafting (the drafter's block, maybe swapped for a copy that
    # lookup.choose preferred: scored as the block would have been) or the copies (a copy alone), never both
    drafter = [(k, m) for k, m in seen["drafter"] if k]
    assert len(drafter) + len(seen["copies"]) == sum(r.stats.n_draft_steps for r in results)
    assert len(seen["copies"]) >= 8 and sum(m for _, m in seen["copies"]) > 0.5 * sum(k for k, _ in seen["copies"])
    assert sum(m for _, m in drafter) < 0.2 * sum(k for k, _ in drafter)  # the drafter's blocks earn (almost) nothing


def test_copies_stand_in_for_blocks_only_where_every_drafting_slot_would_copy():
    text = list(range(100, 100 + LONG_MATCH + 3))
    looping, fresh = History(text + [7] + text[:LONG_MATCH]), History(text)
    losing = Edge()
    losing.observe(0, 5)  # its copies earned less than its blocks lately
    policy = CopyPolicy(_costs(plain=2e-3, per_token=2e-5, up_to=64))
    # each refusal names its reason (the step trace records it: scripts/bench/trace_summary.py, stand_in)
    held = [([(SlotCopies(), Edge(), looping, 4), (SlotCopies(), Edge(), fresh, 4)], "match"),
            ([(SlotCopies(), losing, looping, 4)], "edge"), ([(SlotCopies(wait=1), Edge(), looping, 4)], "wait"),
            ([(SlotCopies(), Edge(), None, 4)], "history")]
    for drafting, why in held:
        assert not policy.first(drafting) and policy.why == why
    assert policy.first_steps == 0
    # where all would: every CHECK_EVERY-th such step still drafts, so the edges keep learning
    decided = [(policy.first([(SlotCopies(), Edge(), looping, 4)] * 2), policy.why) for _ in range(2 * CHECK_EVERY)]
    assert decided == ([(True, "copy")] * (CHECK_EVERY - 1) + [(False, "check")]) * 2


def test_a_drafting_engine_skips_the_drafter_where_the_slots_loop(tiny, monkeypatch):
    """The policy drafts every step (forced: a regular decision each time) while the tiny qwen3 target's text loops:
    in the steps where the looping slots would verify copies anyway, no drafter forward runs, but one such step in
    CHECK_EVERY still drafts; the text is plain greedy's."""
    p = tiny("qwen3")
    monkeypatch.setattr(DraftPolicy, "regular", property(lambda self: True))
    with api.load(p.target, p.drafter, config=EngineConfig(n_ctx_slot=1024, n_slots=2, adaptive=True)) as llm:
        engine = llm.engine
        engine.drafting.plan = lambda slots: Plan([m for _, m in slots], True)
        steps, blocks = [], []  # per step: (the plan drafted, copies stood in); per drafter call: it drafted
        first, propose = engine._copy_first, engine.drafter.propose

        def copy_first(plan):
            out = first(plan)
            steps.append((any(k for _, k in plan), not any(k for _, k in out)))
            return out

        def counted(plan, during=None):
            blocks.append(any(k for _, k in plan))
            return propose(plan, during)

        engine._copy_first, engine.drafter.propose = copy_first, counted
        reqs = [Request(llm.tokenize(t), max_tokens=400, ignore_eos=True) for t in (LOOP, LOOP)]
        results = llm.generate_many(reqs)
        first_steps = engine.copies.first_steps
    oracle = Oracle(p.target)
    for req, res in zip(reqs, results):
        oracle.check(req.prompt, res.tokens)
    oracle.close()
    stood_in = sum(1 for drafted, out in steps if drafted and out)
    assert stood_in >= 15 and stood_in == first_steps - first_steps // CHECK_EVERY
    assert sum(blocks) == sum(1 for drafted, out in steps if drafted and not out)  # a block wherever one was left
    assert sum(r.stats.n_lookup_accepted for r in results) > 400


def test_no_lookup_means_no_copies(tiny):
    p = tiny("qwen3")
    _, results, seen = _run(p.target, p.drafter, [LOOP], n=96, lookup=False)
    assert results[0].stats.n_lookup_steps == 0 and not seen["copies"]


def test_copies_take_only_what_the_target_batch_has_left_after_a_prompt_chunk(tiny):
    """A long prompt arrives while a looping slot copies: its chunk takes the batch first and the copy what is left
    (the H100 through HTTP, before: "batch capacity 512 exceeded (518 tokens)", and the engine failed)."""
    p = tiny("qwen3")
    long_prompts = [" ".join(f"word{i * j}" for i in range(150)) for j in range(1, 7)]
    config = EngineConfig(n_ctx_slot=1024, n_slots=2, adaptive=True, n_batch=32, n_ubatch=32)
    with api.load(p.target, p.drafter, config=config) as llm:
        assert llm.engine.target_ctx.params.n_batch == 32
        # the loop runs in one slot while the long prompts go through the other one after another
        reqs = [Request(llm.tokenize(LOOP), max_tokens=300, ignore_eos=True)] + [
            Request(llm.tokenize(t), max_tokens=4, ignore_eos=True) for t in long_prompts]
        chunked_while_copying = []
        step = llm.engine._copy_where_idle
        llm.engine._copy_where_idle = lambda plan, drafts, chunks: (
            lambda out: (chunked_while_copying.append(bool(out and chunks)), out)[1])(step(plan, drafts, chunks))
        results = llm.generate_many(reqs)
    assert any(chunked_while_copying)  # the situation arose: a chunk and a copy in one forward
    oracle = Oracle(p.target)
    for req, res in zip(reqs, results):
        oracle.check(req.prompt, res.tokens)
    oracle.close()


def test_max_tokens_and_stop_strings_cut_a_copy_where_they_fall(tiny):
    """A copied block commits up to 16 tokens a step: max_tokens falling inside one (with and without stop strings,
    whose path commits token by token) emits exactly that many, the plain greedy text's, also from the prompt
    cache on the runs after the first."""
    p = tiny("qwen3")
    oracle = Oracle(p.target)
    toks = oracle.llm.tokenize(LOOP)
    want = oracle.greedy(toks, 120)
    copied = 0
    with api.load(p.target, p.drafter, config=EngineConfig(n_ctx_slot=1024, adaptive=True)) as llm:
        for n in range(100, 112):
            for stop in ([], ["never in this text"]):
                res = llm.generate(toks, max_tokens=n, ignore_eos=True, stop=stop)
                assert len(res.tokens) == n and res.finish_reason == "length", (n, stop, res.finish_reason)
                oracle.check(toks, res.tokens, base_tokens=want[:n])
                copied += res.stats.n_lookup_steps
    oracle.close()
    assert copied > 24  # copies ran in (nearly) every run
