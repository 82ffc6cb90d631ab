"""The prompt cache inside the engine, on tiny factory pairs: slot files (and their refusals), two conversations
evicting each other under a small RAM cap, and snapshots taken while adaptive drafting had features paused."""

from __future__ import annotations

import numpy as np
import pytest

from pydflash.cache import CacheConfig, slotfile
from pydflash.config import EngineConfig
from pydflash.engine.adaptive import FEATURE_LEAD
from pydflash.engine.engine import Engine
from pydflash.engine.request import Request
from pydflash.errors import CacheFileError, InvalidRequest
from pydflash.pair import load_pair

OFF = CacheConfig(reuse=False, ram_mib=0)


def prompt(seed, n):
    return [1] + np.random.default_rng(seed).integers(5, 500, n - 1).tolist()


def test_slot_file_save_restore_and_refusals(qwen, tiny, tmp_path):
    cfg = EngineConfig(n_slots=2, n_ctx_slot=256)
    eng, off = Engine(qwen, cfg), Engine(qwen, cfg, cache=OFF)
    p, q = prompt(1, 120), prompt(2, 80)
    base = off.generate(p, max_tokens=16, ignore_eos=True).tokens
    assert eng.generate(p, max_tokens=16, ignore_eos=True).tokens == base
    seq = next(i for i, r in enumerate(eng.prompt_cache.resident) if r is not None)
    path = slotfile.safe_path(tmp_path, "p.slot")
    kept = len(eng.prompt_cache.resident[seq].tokens)
    saved = eng.save_slot(seq, path)
    # the prompt and the generated tokens the KV holds: the 16th too where the last step accepted it as a draft (a
    # copied chain: this tiny pair loops), not where it was the bonus (the next anchor, never through the target)
    assert kept in (120 + 15, 120 + 16) and saved["n_saved"] == kept
    other = 1 - seq
    eng.restore_slot(other, path)
    eng.prompt_cache.resident[seq] = None  # forget the original: the next request must use the restored slot
    r = eng.generate(p, max_tokens=16, ignore_eos=True)
    assert r.tokens == base and r.stats.n_cached == 119
    assert eng.prompt_cache.resident[other] is not None

    good = path.read_bytes()
    bad = {"corrupted": good[:100] + bytes([good[100] ^ 1]) + good[101:], "truncated": good[: len(good) - 1000]}
    snap = slotfile.load(good, eng.prompt_cache.digests)
    snap.features.drafter_len -= 3  # bookkeeping that disagrees with the drafter state it ships with
    bad["size mismatch"] = slotfile.dump(snap, eng.prompt_cache.digests)
    snap = slotfile.load(good, eng.prompt_cache.digests)
    assert len(snap.features.positions)  # the last step's features, not injected yet
    snap.features.positions = snap.features.positions + 1  # pending rows that skip a position
    bad["feature positions"] = slotfile.dump(snap, eng.prompt_cache.digests)
    g3 = tiny("gemma3")
    foreign = Engine(load_pair(g3.target, g3.drafter), cfg)
    foreign.generate(q, max_tokens=4, ignore_eos=True)
    fseq = next(i for i, r in enumerate(foreign.prompt_cache.resident) if r is not None)
    foreign.save_slot(fseq, tmp_path / "foreign.slot")
    bad["foreign"] = (tmp_path / "foreign.slot").read_bytes()
    with pytest.raises(CacheFileError, match="feature positions"):
        slotfile.load(bad["feature positions"], eng.prompt_cache.digests)
    for why, data in bad.items():
        (tmp_path / "bad.slot").write_bytes(data)
        with pytest.raises(CacheFileError):
            eng.restore_slot(0, tmp_path / "bad.slot")
        # the slot is still usable and correct, and nothing half-restored is reused
        r = eng.generate(q, max_tokens=8, ignore_eos=True)
        assert r.tokens == off.generate(q, max_tokens=8, ignore_eos=True).tokens, why
    with pytest.raises(InvalidRequest):
        eng.save_slot(7, tmp_path / "x")
    eng.submit(eng_req := Request(p, max_tokens=50))
    eng.step()
    busy = next(i for i, s in enumerate(eng.slots) if s is not None)
    with pytest.raises(InvalidRequest, match="busy"):
        eng.restore_slot(busy, path)
    eng.cancel(eng_req.id)
    for e in (eng, off, foreign):
        e.close()


def test_two_conversations_evict_each_other_under_a_small_cap(qwen):
    """One slot, no device tier, a RAM cap of ~3 snapshots: A and B alternate (each turn restores the other from
    RAM), then 200 distinct prompts churn the cache; outputs equal the cache-off engine's and the bytes never pass
    the cap."""
    cap_mib = 0.6
    cfg = EngineConfig(n_slots=1, n_ctx_slot=512)
    ram_only = CacheConfig(ram_mib=cap_mib, save_min_drop=16, device_cells=0)
    eng, off = Engine(qwen, cfg, cache=ram_only), Engine(qwen, cfg, cache=OFF)
    ram = eng.prompt_cache.ram
    conv = {"a": prompt(3, 150), "b": prompt(4, 130)}
    for turn in range(4):
        for name in ("a", "b"):
            r = eng.generate(conv[name], max_tokens=10, ignore_eos=True)
            assert r.tokens == off.generate(conv[name], max_tokens=10, ignore_eos=True).tokens
            if turn:
                assert r.stats.n_cached >= len(conv[name]) - 30, (turn, name, r.stats.n_cached)
            conv[name] = conv[name] + r.tokens + prompt(10 * turn + len(name), 20)[1:]
            assert ram.bytes <= ram.cap
    assert ram.hits >= 6
    peak = 0
    for i in range(200):
        eng.generate(prompt(1000 + i, 40 + i % 50), max_tokens=1, ignore_eos=True)
        peak = max(peak, ram.bytes)
        assert ram.bytes <= ram.cap == int(cap_mib * 2**20)
    assert ram.evictions > 50 and peak > ram.cap // 2, ram.metrics()
    eng.close()
    off.close()


def test_snapshot_taken_while_features_were_paused(qwen, tmp_path, monkeypatch):
    """Adaptive drafting with a useless drafter pauses feature extraction: the kept sequence has features for a
    prefix only (or its drafter context restarted after the pause). A paused engine still reuses the whole kept
    sequence (the target KV is exact): the drafter's context restarts at the reuse point, as after any pause. A
    request about to draft reuses it only up to FEATURE_LEAD positions before its end (or where its features end,
    if nearer), and those are prefilled again with features: its drafter has a context at its first draft, where
    it had none (a probe drafted blind, and a recurring prompt first seen in a pause never drafted again). After
    a slot-file restore on an engine that drafts every step, the engine's invariants hold at every commit and the
    output is the cache-off output."""
    cfg = EngineConfig(n_slots=1, n_ctx_slot=512)
    ada = Engine(qwen, EngineConfig(n_slots=1, n_ctx_slot=512, adaptive=True))
    off = Engine(qwen, cfg, cache=OFF)
    p = prompt(5, 60)
    r1 = ada.generate(p, max_tokens=160, ignore_eos=True)
    res = ada.prompt_cache.resident[0]
    f = res.features
    assert f.gap or f.drafter_base > 0, "adaptive drafting never paused features: the test proves nothing"
    assert not f.keeps_context(res.n)
    ada.save_slot(0, tmp_path / "paused.slot")

    p2 = p + r1.tokens + prompt(6, 30)[1:]
    want = off.generate(p2, max_tokens=24, ignore_eos=True).tokens
    monkeypatch.setattr(ada.drafting, "expects_drafting", lambda n=None: False)  # paused: nothing drafts soon
    r2 = ada.generate(p2, max_tokens=24, ignore_eos=True)  # same engine, resident path
    assert r2.tokens == want and r2.stats.n_cached == res.n
    assert ada.prompt_cache.drafter_restarts == 1 and ada.prompt_cache.context_trims == 0

    plain = Engine(qwen, cfg)  # drafts every step: its drafter gets the lead-in's features back
    plain.restore_slot(0, tmp_path / "paused.slot")
    q = max(res.n - FEATURE_LEAD, f.context_end(res.n))
    plain.submit(Request(p2, max_tokens=24, ignore_eos=True))
    plain.step()  # admission and the first prompt chunk
    slot = plain.slots[0]
    assert slot.stats.n_cached == q < res.n and plain.prompt_cache.context_trims == 1
    while not slot.prefilled:
        plain.step()
    assert slot.n_featured - slot.drafter_base >= min(FEATURE_LEAD, res.n), "the drafter has no context"
    r3 = None
    while r3 is None:
        r3 = next((e.result for e in plain.step() if e.finished), None)
    assert r3.tokens == want and r3.stats.n_drafted > 0
    assert plain.prompt_cache.drafter_restarts == (0 if f.keeps_context(q) else 1)
    for e in (ada, off, plain):
        e.close()


def test_cancel_during_chunked_prefill_keeps_the_prefilled_part(qwen):
    """A request cancelled after one prompt chunk leaves that chunk (target KV + features) for the next request
    with the same prompt, which prefills only the rest; output equals the cache-off engine's."""
    cfg = EngineConfig(n_slots=1, n_ctx_slot=512, n_batch=64, n_ubatch=64)
    eng, off = Engine(qwen, cfg), Engine(qwen, cfg, cache=OFF)
    p = prompt(7, 200)
    req = Request(p, max_tokens=8, ignore_eos=True)
    eng.submit(req)
    eng.step()  # admission and the first chunk
    assert eng.slots[0] is not None and 0 < eng.slots[0].n_past < len(p) - 1
    done = eng.slots[0].n_past
    eng.cancel(req.id)
    assert eng.prompt_cache.resident[0].n == done
    r = eng.generate(p, max_tokens=8, ignore_eos=True)
    assert r.stats.n_cached == done and r.tokens == off.generate(p, max_tokens=8, ignore_eos=True).tokens
    eng.close()
    off.close()
