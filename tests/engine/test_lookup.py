"""Copied chains (engine/lookup.py): where a slot's last tokens occurred before, what followed them is verified
instead of the drafter's block when it looks better; the output stays the target's."""

from __future__ import annotations

import pytest

from tests.helpers.oracle import Oracle
from pydflash import api
from pydflash.config import EngineConfig
from pydflash.engine.lookup import LONG_MATCH, NGRAM, Edge, History, choose, splice, would_accept
from pydflash.engine.request import Request


def test_continuation_follows_the_last_earlier_occurrence():
    h = History([1, 2, 3, 4, 5, 9, 1, 2, 3, 7, 8, 1, 2, 3])
    assert h.continuation(2) == ([7, 8], NGRAM)  # the later of the two earlier "1 2 3"
    assert History([1, 2, 3, 4]).continuation(3) == ([], 0)  # its last three tokens never came before
    assert History([5, 6]).continuation(3) == ([], 0)


def test_a_match_that_runs_into_the_present_continues_the_loop():
    h = History([7, 1, 2, 1, 2, 1, 2])
    copy, n = h.continuation(5)
    assert copy == [1, 2, 1, 2, 1]
    assert n == 4  # "1 2 1 2" ends two tokens back; the 7 before it breaks the match


def test_match_length_counts_back_to_long_match():
    text = list(range(100, 100 + LONG_MATCH + 4))
    h = History(text + [0] + text[:LONG_MATCH + 1])
    copy, n = h.continuation(3)
    assert n == LONG_MATCH and copy == text[LONG_MATCH + 1:LONG_MATCH + 4]


def test_history_extends_as_tokens_commit():
    h = History([1, 2, 3, 4])
    h.extend([1, 2])
    assert h.continuation(2) == ([], 0)  # "4 1 2" is new
    h.extend([3])
    assert h.continuation(2) == ([4, 1], NGRAM)


def test_choose_takes_the_copy_when_it_agrees_with_the_first_draft_or_runs_long():
    short = History([1, 2, 3, 4, 5, 1, 2, 3])  # a 3-token match (the history starts there): copy 4 5 1
    assert choose([4, 9, 9], short, 3, Edge()) == ([4, 5, 1], [4, 9, 9], True)
    assert choose([6, 9, 9], short, 3, Edge()) == ([6, 9, 9], None, False)  # disagrees, match short: no candidate
    text = list(range(50, 50 + LONG_MATCH))
    long = History(text + [7, 6] + text)
    assert choose([0, 0], long, 2, Edge()) == ([7, 6], [0, 0], True)  # against the drafter: the match runs long
    shorter = History(text + [7, 6] + text[1:])
    assert choose([0, 0], shorter, 2, Edge()) == ([0, 0], None, False)  # one token short of it
    assert choose([0, 0], History([1, 2, 3]), 2, Edge()) == ([0, 0], None, False)  # nothing to copy


def test_a_lookup_can_be_keyed_on_drafts_not_yet_verified():
    h = History([1, 2, 3, 4, 5, 9])
    assert h.continuation(2, extra=[1, 2, 3]) == ([4, 5], NGRAM)  # keyed on "1 2 3", which the drafts end with
    assert h.continuation(2, extra=[7, 2, 3]) == ([], 0)  # "7 2 3" never came before
    assert h.continuation(2, extra=[9, 1]) == ([], 0)  # "9 9 1": nor this, spanning history and drafts
    # a match that runs into the drafts continues the loop through them
    assert History([7, 1, 2, 1, 2, 1]).continuation(4, extra=[2]) == ([1, 2, 1, 2], 4)


# a timetable: each line a new time T, then the same "X Y Z W" and a newline NL
T1, T2, T3, X, Y, Z, W, NL = 101, 102, 103, 11, 12, 13, 14, 10


def test_a_copy_spliced_after_the_drafts_that_guess_the_new_words():
    """The next line's time is new, so the copy keyed on the history's end (the previous line's time) parts from the
    drafter at once; past the drafter's own "T3 X Y Z" the text repeats its template, and a copy keyed there takes
    over where the drafter's later guesses go wrong."""
    h = History([T1, X, Y, Z, W, NL, T2, X, Y, Z, W, NL])
    drafts = [T3, X, Y, Z, W, 99, 98]
    assert h.continuation(7)[0][0] == T2  # the plain lookup: no candidate against the first draft
    # the copy runs from the last line's "W NL" into the present: the line it copies is the drafted one
    assert splice(drafts, h, 7) == [T3, X, Y, Z, W, NL, T3]
    assert choose(drafts, h, 7, Edge()) == ([T3, X, Y, Z, W, NL, T3], drafts, True)
    assert splice([T3, X, Y, Z, W, NL, T3], h, 7) is None  # the drafts already say what the copy says
    assert splice([T3, X, Y, Z, 99, NL, T2], h, 7) is None  # the copy must start with the drafter's next draft
    assert splice([T3, 55, 56, 57, 58, 59, 60], h, 7) is None  # nothing of the drafts occurred before


def test_a_slot_whose_copies_earn_less_verifies_its_blocks():
    """JSON records, CSV rows: a 3-token match that agrees with the first draft copies the previous record, where the
    drafter knew the next one. The edge turns negative and the block goes in, the copy still scored; it comes back
    once copies earn more again."""
    edge, short = Edge(), History([1, 2, 3, 4, 5, 1, 2, 3])
    edge.observe(m_copy=1, m_block=6)
    assert edge.value < 0
    assert choose([4, 9, 9], short, 3, edge) == ([4, 9, 9], [4, 5, 1], False)
    for _ in range(3):
        edge.observe(m_copy=9, m_block=1)
    assert choose([4, 9, 9], short, 3, edge) == ([4, 5, 1], [4, 9, 9], True)


REPEATS = "the cat sat on the mat. the cat sat on the mat. the cat sat on the mat. the cat"


def _run(target, drafter, prompts, lookup: bool, n: int = 48):
    with api.load(target, drafter, config=EngineConfig(n_ctx_slot=1024, n_slots=len(prompts), lookup=lookup)) as llm:
        reqs = [Request(llm.tokenize(t), max_tokens=n, ignore_eos=True) for t in prompts]
        return reqs, llm.generate_many(reqs)


def test_copied_chains_keep_the_targets_greedy_text(tiny):
    """The tiny target does not repeat, so its copies get rejected: verified, rolled back, output plain greedy's
    (the oracle) and the same with lookup off."""
    p = tiny("gemma3")
    oracle = Oracle(p.target)
    reqs, on = _run(p.target, p.drafter, [REPEATS, "hello world"], True)
    _, off = _run(p.target, p.drafter, [REPEATS, "hello world"], False)
    for req, res in zip(reqs, on):
        oracle.check(req.prompt, res.tokens)
    assert [r.tokens for r in on] == [r.tokens for r in off]
    assert on[0].stats.n_lookup_steps > 0 and off[0].stats.n_lookup_steps == 0
    oracle.close()


@pytest.mark.real_model
def test_gemma_copies_a_passage_it_saw_once(gemma_path):
    """The drafter suite's "passage copied once" and a looping sentence on the shipped pair: the target copies, the
    drafter alone does not (tau ~2 on the passage, versions 4 and 5), copied chains do; the text stays plain
    greedy's."""
    from pydflash.defaults import SHIPPED_DRAFTER
    from pydflash.train.eval_suite import REPETITION

    prompts = [REPETITION["passage copied once"], REPEATS]
    reqs, on = _run(gemma_path, str(SHIPPED_DRAFTER), prompts, True, n=64)
    _, off = _run(gemma_path, str(SHIPPED_DRAFTER), prompts, False, n=64)
    oracle = Oracle(gemma_path)
    for req, res in zip(reqs, on):
        oracle.check(req.prompt, res.tokens, max_regret=0.5)
    oracle.close()
    for a, b in zip(on, off):
        assert a.stats.mean_accept_len > b.stats.mean_accept_len, (a.stats, b.stats)
    assert on[0].stats.mean_accept_len >= 2 * off[0].stats.mean_accept_len, (on[0].stats, off[0].stats)
    assert on[0].stats.n_lookup_accepted > 0


def test_rejection_sampling_requests_get_no_copies(tiny):
    p = tiny("gemma3")
    with api.load(p.target, p.drafter, config=EngineConfig(n_ctx_slot=512)) as llm:
        req = Request(llm.tokenize(REPEATS), max_tokens=32, temperature=0.8, seed=3)  # rejection: the default mode
        res = llm.generate_many([req])[0]
    assert res.stats.n_lookup_steps == 0 and res.stats.n_drafted > 0


def test_would_accept_scores_the_unverified_chain():
    chain, picks = [5, 6, 7, 8], [5, 6, 7, 9, 4]  # the copy: 3 accepted, the target picked 9 after 5 6 7
    assert would_accept([5, 6, 7, 8], chain, picks, 3) == 3  # the same chain
    assert would_accept([5, 1, 1, 1], chain, picks, 3) == 1  # parts from the copy at 1: the target took 6
    assert would_accept([5, 6, 7, 9], chain, picks, 3) == 4  # holds the bonus too (at least 4)
    assert would_accept([1, 1, 1, 1], chain, picks, 3) == 0
    assert would_accept([3, 3, 3, 3], chain, [4, 0, 0, 0, 0], 0) == 0  # copy rejected at once, block too
    assert would_accept([4, 3, 3, 3], chain, [4, 0, 0, 0, 0], 0) == 1  # the block had the target's pick


def greedy_truth(pair, prompt: str = "hello world, once more") -> tuple[list[int], list[int], int]:
    """The prompt's tokens, plain greedy's 200-token continuation, and the vocabulary size: the text a stand-in
    ``choose`` copies from."""
    with api.load(pair.target, config=EngineConfig(n_ctx_slot=512)) as plain:
        toks = plain.tokenize(prompt)
        return toks, plain.generate(toks, max_tokens=200, ignore_eos=True).tokens, plain.engine.model.n_vocab


def run_observed(pair, toks: list[int]) -> tuple[object, list[tuple[int, int]]]:
    """120 tokens of adaptive speculation, and every (drafts, accepted) the policy was taught."""
    with api.load(pair.target, pair.drafter, config=EngineConfig(n_ctx_slot=512, adaptive=True)) as llm:
        seen = []
        observe = llm.engine.drafting.observe
        llm.engine.drafting.observe = lambda pol, k, m: (seen.append((k, m)), observe(pol, k, m))
        return llm.generate(toks, max_tokens=120, ignore_eos=True), seen


def test_adaptive_drafting_learns_from_the_drafter_not_the_copies(tiny, monkeypatch):
    """Every verified chain is a copy the target accepts whole (here: plain greedy's own continuation, fed as the
    copy), while the tiny random drafter's blocks earn nothing. The policy must see the drafter's 0s, or a useless
    drafter looks useful wherever text repeats and drafting never pauses."""
    from pydflash.engine import engine as engine_mod

    p = tiny("gemma3")
    toks, greedy, _ = greedy_truth(p)
    truth = toks + greedy

    def copy_truth(drafts, history, k, edge):
        at = len(history.tokens)
        return truth[at:at + k], drafts, True

    monkeypatch.setattr(engine_mod.lookup, "choose", copy_truth)
    res, seen = run_observed(p, toks)
    assert res.tokens == greedy[:120]
    assert res.stats.n_lookup_accepted == res.stats.n_accepted > 0  # every chain was the (right) copy
    assert seen and sum(m for _, m in seen) <= len(seen) // 4, seen  # ...but the policy saw the drafter's own
    assert res.stats.n_draft_steps < res.stats.n_steps / 2  # so it paused, as for any useless drafter


def test_a_block_that_held_the_bonus_is_not_counted_as_failing_after_it(tiny, monkeypatch):
    """A verified copy rejected at m while the drafter's block also had the target's pick there: the block is known
    to be right through m + 1 and untested past it. Counted as k drafts with m + 1 accepted, that lower bound taught
    adaptive drafting a rejection that never happened, wherever copies went in; it sees m + 1 of m + 1."""
    from pydflash.engine import engine as engine_mod

    p = tiny("gemma3")
    toks, greedy, n_vocab = greedy_truth(p)
    truth = toks + greedy

    def copy_wrong_at_2(drafts, history, k, edge):
        at = len(history.tokens)
        block = truth[at:at + len(drafts)]  # a perfect block
        copy = list(block)
        if len(copy) > 2:
            copy[2] = (copy[2] + 1) % n_vocab
        return copy, block, True

    monkeypatch.setattr(engine_mod.lookup, "choose", copy_wrong_at_2)
    res, seen = run_observed(p, toks)
    assert res.tokens == greedy[:120]
    censored = [(k, m) for k, m in seen if m == 3]  # copies rejected at 2, the block right through the bonus
    assert censored and all(k == 3 for k, _ in censored), seen
    assert res.stats.n_draft_steps > res.stats.n_steps / 2  # the block was never wrong: drafting never paused
